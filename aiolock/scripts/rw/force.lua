-- End one mode's holds of a read-write lock, whoever holds them, and wake who may now get in.
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]     the mode: 'w' ends the write hold, 'r' every read hold (the writer's own too)
--
-- Returns 1 if anyone held it in that mode, else 0.  The other mode's holders keep theirs, as
-- in Redisson.  Once nobody holds it the lock is deleted and the next are woken as by a
-- release; a forced write hold that leaves readers (its owner's own) wakes as a downgrade does.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local mode = ARGV[1]
if mode ~= 'r' and mode ~= 'w' then
    return redis.error_reply('ERR aiolock: mode must be r or w')
end
local now = now_ms()
expire(now)
local writer = redis.call('HGET', KEYS[1], 'w')
if mode == 'w' then
    if not writer then
        return 0
    end
    redis.call('HDEL', KEYS[1], 'w', 'wc', 'we', ':fence')
    if not redis.call('HGET', KEYS[1], 'r:' .. writer) then
        forget(writer)
    end
    if live_readers(now) == 0 then
        free('forced')
    else
        retime(now)
        wake_after_write()
    end
    return 1
end
local readers = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf')
if #readers == 0 then
    return 0
end
for _, owner in ipairs(readers) do
    redis.call('HDEL', KEYS[1], 'r:' .. owner, 't:' .. owner)
    redis.call('ZREM', KEYS[3], owner)
    if owner ~= writer then
        forget(owner)
    end
end
if writer then
    retime(now)  -- the writer's read holds are gone, its write hold stays: nobody else may enter
else
    free('forced')
end
return 1
