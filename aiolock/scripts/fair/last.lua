-- The owner's last release of a fair lock with no fault around it, as its client knows (one
-- hold, its acquire not resent, no release of the owner resent lately): the fields of its
-- hold end in one HDEL, as the plain lock's HDEL release (aiolock/_core/release.py), and the
-- lock, now free, is granted to the next waiter (see hand_over in _queue.lua).
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue (see _queue.lua)
-- KEYS[4]  the prefix of the per-client wake-up channels
-- KEYS[5]  the fencing token counter (a grant from the queue takes a token)
-- KEYS[6]  the prefix of the per-client alive keys of the lock's slot (see _queue.lua)
-- ARGV[1]  owner id
-- ARGV[2]  a lower bound of the server's time in ms (the client's, from its sample of the
--          clock: the next waiter counts its lease from it), or '-' to read TIME
--
-- Returns 3 when the hold was there and is ended (the lock is free, and handed over), else 0
-- (the owner held nothing: its hold was lost).  Every field of a hold is named by its owner
-- (common/_hold.lua) and a fair lock has one owner at a time, so with its fields and a grant
-- mark ('q:<owner>') gone the hash is gone.  Not idempotent by request, so a copy of it
-- that may arrive late (resent, or its outcome unknown) must not meet a later hold of the
-- owner: its client gives the owner's next holds another id for the resend window.
local owner = ARGV[1]
local removed = redis.call('HDEL', KEYS[1], owner, 'f:' .. owner, 'r:' .. owner,
    'x:' .. owner, ':late:' .. owner, 'q:' .. owner)
if removed < 3 then
    return 0
end
local first = redis.call('LPOP', KEYS[3])
if not first then
    return 3
end

--@include common/_time
--@include fair/_queue
hand_over(tonumber(ARGV[2]) or now_ms(), first)
return 3
