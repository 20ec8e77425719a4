-- Void acquires of one permit whose late copies may still be on their way (the semaphore's
-- common/void.lua): each was resent, its first copy went out on a connection that failed, so
-- that copy can still arrive after the permit was released (or, for a try that was refused,
-- once a permit is free).  From then on a copy of any of these requests grants nothing.
--
-- KEYS[1]  the void marks: '<permit id>/<request>' -> until when (see _permits)
-- ARGV[1]  the permit id
-- ARGV[2]  the client's resend window in ms: how long the marks live
-- ARGV[3..] the acquire request ids to void
--
-- Returns how many were voided.  Each mark lives the window; marks past their time are dropped
-- when marks are added, and the key lives as long as its latest mark.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local now = now_ms()
local ms = resend_ms(ARGV[2])
for i = 3, #ARGV do
    void_permit_request(KEYS[1], ARGV[1] .. '/' .. ARGV[i], now, ms)
end
return #ARGV - 2
