-- Set the lease of one owner's read hold of a read-write lock to a new length from now
-- (guard.extend(lease)); the lock's keys then live as long as its longest live hold.
--
-- KEYS[1..7] as every rw script's (see rw/_rw.lua): the lock hash, the meta hash, the readers,
--          the waiting writers, the two channels, the fencing counter
-- ARGV[1]  the new lease in milliseconds, from now (longer or shorter than the one it replaces)
-- ARGV[2]  owner id
-- ARGV[3]  the guard's fencing token (the owner's read token, 't:<owner>')
--
-- Returns 1 when the lease was set, 0 when the owner no longer holds a read hold with that
-- token (a lease end already past counts as no hold, whether or not it was dropped yet).
--@include common/_time
--@include common/_requests
--@include rw/_rw
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local now = now_ms()
local token = redis.call('HGET', KEYS[1], 't:' .. ARGV[2])
local ends = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[2]))
if token ~= ARGV[3] or not ends or ends <= now then
    return 0
end
redis.call('ZADD', KEYS[3], now + lease, ARGV[2])
retime(now)
return 1
