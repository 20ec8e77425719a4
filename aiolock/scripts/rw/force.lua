-- Delete a read-write lock whoever holds it (readers and writer), and wake the next.
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
--
-- Returns 1 if anyone held it, else 0.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local now = now_ms()
expire(now)
if redis.call('EXISTS', KEYS[1]) == 1 then
    free('forced')
    return 1
end
return 0
