-- Delete a lock whoever holds it, and wake a waiter.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  optional: the prefix of the lock's channels, one per client (none for a kind whose
--          waiters do not subscribe)
-- KEYS[3]  with KEYS[2]: the lock's waiting owners (lock/_waiting.lua)
--
-- Returns 1 if the lock existed, else 0.  The client of the first waiting owner is woken, not
-- granted the lock (a grant could reach the forcing client's own waiter before the force's
-- reply, which then takes every hold of the lock in that client for lost): one of its waiters
-- tries, and the others of every client try when the lease they parked under ends.
if redis.call('DEL', KEYS[1]) == 1 then
    if KEYS[3] then
        local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
        local client = first and string.match(first, '^%d+ %d+ (%S+) ')
        if client then
            redis.call('PUBLISH', KEYS[2] .. client, 'forced')
        end
    end
    return 1
end
return 0
