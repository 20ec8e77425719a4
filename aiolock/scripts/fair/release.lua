-- Release one hold of a fair lock; the last release deletes it and grants it to the next
-- waiter (or wakes it: see hand_over in _queue.lua).  The owner's last fault-free release
-- is last.lua; this one serves the others (re-entered holds, undo, resends, late copies).
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash: an undo of an acquire that was not applied marks '<owner>/<n>'
--          there (see common/_requests.lua); nothing else is written to it
-- KEYS[3]  the queue (see _queue.lua)
-- KEYS[4]  the prefix of the per-client wake-up channels
-- KEYS[5]  the fencing token counter (a grant from the queue takes a token)
-- KEYS[6]  the prefix of the per-client alive keys of the lock's slot (see _queue.lua)
-- ARGV[1]  owner id
-- ARGV[2]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[3]  optional: undo mode, the id of an acquire request whose outcome the caller never
--          saw; release only if that acquire was the owner's last request
--
-- Returns the holds the owner has left (0: the lock was deleted and handed over),
-- or nil when the owner does not hold the lock.  Idempotent per request, and a late copy of a
-- resent release changes nothing, as the plain lock's.
local owner, request = ARGV[1], ARGV[1] .. '/' .. ARGV[2]
local held = redis.call('HMGET', KEYS[1], owner, 'r:' .. owner, ':w', ':late:' .. owner)
local first
-- The last release with no fault of its own comes first, before the helpers below (defining
-- them costs the server more than this path): the owner's one hold, no undo, not a resend of
-- the request applied last, no resent release of this owner around.  With nobody queued,
-- that is all.  The head is taken out of the queue as it is read: it is granted, or dropped
-- if it vanished; hand_over puts it back at the head if it is only to be woken.
if held[1] == '1' and not ARGV[3] and held[2] ~= request and not held[4] then
    redis.call('DEL', KEYS[1])
    first = redis.call('LPOP', KEYS[3])
    if not first then
        return 0
    end
end

--@include common/_time
--@include common/_requests
--@include common/_hold
--@include fair/_queue
if first then  -- released above: hand the lock over to the queue's head
    hand_over(now_ms(), first)
    return 0
end
local undo = ARGV[3] and owner .. '/' .. ARGV[3]
local left, deleted = release_one(KEYS[1], KEYS[2], owner, request, undo, held)
if deleted then
    hand_over(now_ms())
end
return left
