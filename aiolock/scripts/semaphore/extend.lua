-- Set the lease of one permit to a new length from now (permit.extend(lease)).
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms), and the count (see _permits)
-- ARGV[1]  the new lease in milliseconds, from now (longer or shorter than the one it replaces)
-- ARGV[2]  the permit id (unique per acquisition: it plays the fencing token's part)
--
-- Returns 1 when the lease was set, 0 when the permit is not held (a lease end already past
-- counts as not held, whether or not it was dropped yet).  The set then lives as long as its
-- longest permit: a shorter lease may shorten it.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local now = now_ms()
local ends = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]))
if not ends or ends <= now then
    return 0
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
return 1
