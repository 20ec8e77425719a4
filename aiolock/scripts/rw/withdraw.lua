-- A waiting writer gives up (timeout, cancellation): it withdraws from the waiting writers,
-- and stops holding readers back at once.
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]     owner id
--
-- Returns 1 if it was registered as waiting, else 0.  If no writer waits any more and nobody
-- writes, the readers it held back are woken.  Idempotent.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local removed = redis.call('ZREM', KEYS[4], ARGV[1])
if removed == 1 and waiting_writers() == 0 and not redis.call('HGET', KEYS[1], 'w') then
    redis.call('PUBLISH', KEYS[5], 'free')
end
return removed
