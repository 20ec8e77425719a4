-- The semaphore's permits, included by its scripts after common/_time and common/_requests
-- (not run alone).
--
-- KEYS[1] is a sorted set: permit id -> the server time in ms at which its lease ends.  A
-- permit past its lease is no longer held: it is dropped by the next call that looks.  It
-- also keeps void marks, '<permit id>/<request>' -> minus the server time until which that
-- acquire request must grant nothing (a late copy of it may still arrive: it was resent, or
-- undone before it was applied); a negative score, so that marks never count as permits.
-- Marks are written on those fault paths only, for the client's resend window; the set goes
-- with its last permit and its last mark.

-- Drop the permits whose lease ended and the marks past their time; returns the time used.
local function drop_expired()
    local now = now_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. -now, now)
    return now
end

-- How many permits are held (after drop_expired).
local function held()
    return redis.call('ZCOUNT', KEYS[1], '(0', '+inf')
end

-- Mark acquire request (permit id/request id) as one that must never grant, for ms.
local function void_permit_request(request, now, ms)
    redis.call('ZADD', KEYS[1], -(now + ms), request)
    keep(KEYS[1], ms)
end
