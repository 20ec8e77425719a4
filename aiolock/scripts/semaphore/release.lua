-- Give a permit back, and wake one waiter.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms), and the count (see _permits)
-- KEYS[2]  the void marks (see _permits): an undo that finds its acquire not applied marks it
-- KEYS[3]  the semaphore's channel
-- ARGV[1]  the permit id
-- ARGV[2]  request id, unique per call; a resent call carries the same id
-- ARGV[3]  optional: undo mode, the id of an acquire request whose outcome its caller never
--          saw; the permit id names that acquisition alone, so it is released the same way,
--          and if it is not held, that request is voided (a late copy of it grants nothing)
-- ARGV[4]  with ARGV[3]: the client's resend window in ms, how long that mark lives
--
-- Returns 0 when released, nil when the permit was not held (its lease had ended, or this is a
-- resend of the release that gave it back: its client knows it resent and takes that for
-- released).  A release writes no marker: the last live permit deletes the set (its count,
-- and permits past their lease, with it), any other is removed alone and leaves the set
-- expiring with the latest lease left; then the publish.
-- Permits past their lease are otherwise dropped by the next acquire that looks.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local now = now_ms()
local ends = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if ends and ends > now then
    if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 1 then
        redis.call('DEL', KEYS[1])
    else
        -- The set then lives as long as its latest lease: a watchdog's renewal may have kept it
        -- longer, which would leave it behind its last permit.
        redis.call('ZREM', KEYS[1], ARGV[1])
        local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', '(' .. now, 'WITHSCORES', 'LIMIT', 0, 1)
        redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
    end
    redis.call('PUBLISH', KEYS[3], 'released')
    return 0
end
if ARGV[3] then
    -- That acquire was not applied (or its lease ended): a late copy of it must not grant.
    void_permit_request(KEYS[2], ARGV[1] .. '/' .. ARGV[3], now, resend_ms(ARGV[4]))
end
return nil
