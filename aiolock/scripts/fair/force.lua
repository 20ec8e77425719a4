-- Delete a fair lock whoever holds it, and wake the next waiter (woken, not granted: see
-- wake_next in _queue.lua).
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue (see _queue.lua)
-- KEYS[4]  the prefix of the per-client wake-up channels
-- KEYS[5]  the fencing token counter (unused here: every fair script takes the same keys)
-- KEYS[6]  the prefix of the alive keys (unused here: every fair script takes the same keys)
--
-- Returns 1 if the lock existed, else 0.
--@include common/_time
--@include fair/_queue
if redis.call('DEL', KEYS[1]) == 1 then
    wake_next()
    return 1
end
return 0
