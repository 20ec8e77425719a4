-- Release one write hold (see _rw.lua for the seven KEYS).
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]  owner id
-- ARGV[2]  request id; a resent call carries the same id
-- ARGV[3]  optional: undo mode, as for the read release
-- ARGV[4]  with ARGV[3]: the client's resend window in ms (the marker of an undo not applied)
--
-- Returns the owner's write holds left, or nil when it held none (also for a resend of the
-- release that deleted the lock: its client knows it resent).  The last write release
-- keeps the owner's read holds (a downgrade); if nobody reads, the lock is deleted.  Either
-- way a waiting writer is woken, and every waiting reader unless a writer is registered.  A
-- late copy of a release its client resent, arriving once the owner acquired again
-- (':late:<owner>' names it, see _rw.lua), changes nothing and answers the holds left.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local owner = ARGV[1]
local request = owner .. '/' .. ARGV[2]
local now = now_ms()
expire(now)

local undo = ARGV[3] and owner .. '/' .. ARGV[3]
local held = redis.call('HMGET', KEYS[1], 'w', 'wc', 'q:' .. owner, 'r:' .. owner,
    ':late:' .. owner)
if held[1] ~= owner then
    if held[3] == request then
        return 0  -- a resend of a release that landed (the owner still reads)
    end
    if undo then
        burn(owner, undo, held[4] ~= false)  -- that acquire was not applied
    end
    return nil
end
local count = tonumber(held[2])
if held[3] == request or late_release(owner, request, held[5]) then
    return count
end
if undo and held[3] ~= undo then
    burn(owner, undo, true)  -- that acquire was not applied: nothing to undo
    return count
end
count = count - 1
if count > 0 then
    redis.call('HSET', KEYS[1], 'wc', count, 'q:' .. owner, request)
    return count
end
if live_readers(now) == 0 then
    free()
    return 0
end
redis.call('HDEL', KEYS[1], 'w', 'wc', 'we', ':fence')
redis.call('HSET', KEYS[1], 'q:' .. owner, request)  -- it still reads: a downgrade
retime(now)
wake_after_write()
return 0
