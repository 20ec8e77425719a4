-- Give a permit back, and wake one waiter.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms); fence marks (see _permits)
-- KEYS[2]  the meta list: the last 32 releases, each as its request (permit id/request id),
--          so that a resend of a release that landed is recognised (and a second release of a
--          permit is not), and as its permit id, so that a late copy of that permit's acquire
--          grants nothing; it lives as long as the longest lease the released permits had left
-- KEYS[3]  the semaphore's channel
-- ARGV[1]  the permit id
-- ARGV[2]  request id, unique per call; a resent call carries the same id
-- ARGV[3]  optional: undo mode, the id of an acquire request whose outcome its caller never
--          saw; the permit id names that acquisition alone, so it is released the same way,
--          and if it is not held, that request is fenced off (a late copy of it grants nothing)
--
-- Returns 0 when released (also for a resend of a release that landed), nil when the permit
-- was not held (its lease had ended).
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local request = ARGV[1] .. '/' .. ARGV[2]
local now = drop_expired()
local ends = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if ends then
    redis.call('ZREM', KEYS[1], ARGV[1])
    redis.call('LPUSH', KEYS[2], ARGV[1], request)
    redis.call('LTRIM', KEYS[2], 0, 63)
    -- Kept as long as the permit's lease had left: a resend that comes later is answered 'not
    -- held', as the lease would have answered it.
    keep(KEYS[2], math.max(ends - now, 1000))
    redis.call('PUBLISH', KEYS[3], 'released')
    return 0
end
if redis.call('LPOS', KEYS[2], request) then
    return 0
end
if ARGV[3] then
    -- That acquire was not applied (or its lease ended): a late copy of it must not grant.
    fence(ARGV[1] .. '/' .. ARGV[3], now)
end
return nil
