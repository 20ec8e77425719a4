-- A waiter gives up (timeout, cancellation): it withdraws from the fair lock's queue at once.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue: owner -> ticket
-- KEYS[4]  the queue deadlines: owner -> server time in ms
-- KEYS[5]  the prefix of the per-client wake-up channels
-- KEYS[6]  the fencing token counter (unused here: every fair script takes the same keys)
-- ARGV[1]  owner id
--
-- Returns 1 if the owner was queued, else 0.  If it was next and the lock is free, the waiter
-- after it is woken.  Idempotent: withdrawing twice changes nothing.
--@include common/_time
--@include fair/_queue
local was_next = redis.call('ZRANGE', KEYS[3], 0, 0)[1] == ARGV[1]
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if was_next and redis.call('EXISTS', KEYS[1]) == 0 then
    wake_next()
end
return removed
