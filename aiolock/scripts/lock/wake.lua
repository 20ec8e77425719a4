-- Hand on a wake-up of the plain lock: after a release by a bare HDEL that removed ':w' (its client
-- publishes what the release script would have), or for a client that leaves the wait with
-- no call of its own waiting any more.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the lock's waiting clients (lock/_waiting.lua)
-- KEYS[3]  the lock's channel
-- ARGV[1]  optional: the id of a client that leaves; if it is still in the set, it was never
--          named, and nothing else is owed
--
-- Returns 1 when a client was named (or 'released' published), 0 when nothing was owed or the
-- lock is held again: then its holder's last release names the next client (':w' is set for
-- it if anyone waits).
--@include lock/_waiting
if ARGV[1] and redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
    if redis.call('EXISTS', KEYS[2]) == 1 then
        redis.call('HSET', KEYS[1], ':w', '1')
    end
    return 0
end
name_next(KEYS[2], KEYS[3], nil)
return 1
