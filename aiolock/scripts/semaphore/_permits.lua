-- The semaphore's permits, included by its scripts (not run alone).
--
-- KEYS[1] is a sorted set: permit id -> the server time in ms at which its lease ends.  A
-- permit past its lease is no longer held: it is dropped by the next call that looks.

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drop the permits whose lease ended; returns the time used.
local function drop_expired()
    local now = now_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    return now
end

-- Keep the set alive at least ms longer (it lives as long as its longest lease).
local function keep(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, ms)
    end
end
