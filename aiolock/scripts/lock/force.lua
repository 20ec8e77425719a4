-- Delete a lock whoever holds it, and wake a waiter.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  optional: the lock's channel (none for a kind whose waiters do not subscribe)
--
-- Returns 1 if the lock existed, else 0.
if redis.call('DEL', KEYS[1]) == 1 then
    if KEYS[2] then
        redis.call('PUBLISH', KEYS[2], 'forced')
    end
    return 1
end
return 0
