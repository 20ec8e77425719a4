-- The semaphore's permits, included by its scripts (not run alone).
--
-- KEYS[1] is a sorted set: permit id -> the server time in ms at which its lease ends.  A
-- permit past its lease is no longer held: it is dropped by the next call that looks.

-- Drop the permits whose lease ended; returns the time used.
local function drop_expired()
    local now = now_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    return now
end
