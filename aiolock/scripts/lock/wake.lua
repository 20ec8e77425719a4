-- Hand the plain lock over, or withdraw a waiting owner: after a release by a bare HDEL that
-- removed ':w' (its client sends what the release script would have done), or for an owner
-- whose last waiting call left without the lock.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's waiting owners (lock/_waiting.lua)
-- KEYS[3]  the prefix of the lock's channels, one per client
-- KEYS[4]  the fencing token counter (a grant from the set takes a token)
-- ARGV[1]  optional: the member of an owner that withdraws; if it is still in the set, it was
--          never granted, and nothing else is owed; if the lock was granted to it and its
--          client did not take the grant ('q:<owner>' = its n), the lock is taken back and
--          handed over
--
-- Returns 1 when the lock was handed over, 0 when nothing was owed or the lock is held: then
-- its holder's last release hands it over (':w' is set for it if anyone waits).  Idempotent.
--@include lock/_waiting
if ARGV[1] then
    if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
        return 0
    end
    local n, owner = string.match(ARGV[1], '^%d+ (%d+) %S+ (.+)$')
    local held = redis.call('HMGET', KEYS[1], owner, 'q:' .. owner)
    if held[1] ~= '1' or held[2] ~= n then
        return 0
    end
    redis.call('DEL', KEYS[1])
elseif redis.call('EXISTS', KEYS[1]) == 1 then
    if redis.call('EXISTS', KEYS[2]) == 1 then
        redis.call('HSET', KEYS[1], ':w', '1')
    end
    return 0
end
return hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4]) and 1 or 0
