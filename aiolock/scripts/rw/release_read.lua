-- Release one read hold (see _rw.lua for the seven KEYS).
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]  owner id
-- ARGV[2]  request id; a resent call carries the same id
-- ARGV[3]  optional: undo mode, an acquire request whose outcome its caller never saw;
--          release only if that was the owner's last request applied
-- ARGV[4]  with ARGV[3]: the client's resend window in ms (the marker of an undo not applied)
--
-- Returns the owner's read holds left, or nil when it held none (also for a resend of the
-- owner's last read release: its client knows it resent).  The release that frees the lock
-- deletes it and wakes a writer; no release writes a marker.  A late copy of a release its
-- client resent, arriving once the owner acquired again (':late:<owner>' names it, see
-- _rw.lua), changes nothing and answers the holds left, as a resend does.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local owner = ARGV[1]
local request = owner .. '/' .. ARGV[2]
local now = now_ms()
expire(now)

local undo = ARGV[3] and owner .. '/' .. ARGV[3]
local held = redis.call('HMGET', KEYS[1], 'r:' .. owner, 'q:' .. owner, 'w', ':late:' .. owner)
if not held[1] then
    if undo then
        burn(owner, undo, held[3] == owner)  -- that acquire was not applied
    end
    return nil
end
local count = tonumber(held[1])
if held[2] == request or late_release(owner, request, held[4]) then
    return count
end
if undo and held[2] ~= undo then
    burn(owner, undo, true)  -- that acquire was not applied: nothing to undo
    return count
end
count = count - 1
if count > 0 then
    redis.call('HSET', KEYS[1], 'r:' .. owner, count, 'q:' .. owner, request)
    return count
end
redis.call('HDEL', KEYS[1], 'r:' .. owner, 't:' .. owner)
redis.call('ZREM', KEYS[3], owner)
if held[3] == owner then
    redis.call('HSET', KEYS[1], 'q:' .. owner, request)  -- it still writes
elseif live_readers(now) == 0 then
    free()
    return 0
else
    forget(owner)
end
retime(now)
return 0
