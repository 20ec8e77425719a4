-- Void acquires of an owner whose late copies may still be on their way: each was resent
-- (its first copy went out on a connection that failed), and the resend was answered, so the
-- first copy can still arrive, after the owner released what the resend got.  The client
-- runs this before the release that ends the owner's holds: from then on a copy of any of
-- these requests grants nothing once the owner holds the lock no more (common/_requests'
-- stale), whatever other owners' releases come in between.
--
-- KEYS[1]  the meta hash of the lock (see common/_requests.lua)
-- ARGV[1]  owner id
-- ARGV[2]  the client's resend window in ms: how long the marks live
-- ARGV[3..] the acquire request ids to void
--
-- Returns how many were voided.  A field per request, named '<owner>/<request>', whose value
-- is the server time until which it is kept (the window from now): resends are rare (a
-- connection failed mid-call), so the hash gains a few fields only while faults last; they go
-- with the hash a window after the last, or are pruned once past their time (void_request).
--@include common/_time
--@include common/_requests
local ms = resend_ms(ARGV[2])
for i = 3, #ARGV do
    void_request(KEYS[1], ARGV[1] .. '/' .. ARGV[i], ms)
end
return #ARGV - 2
