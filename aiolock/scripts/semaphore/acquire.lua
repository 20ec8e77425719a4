-- Take a permit of a semaphore, if fewer than its count are held.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms), and the count (see _permits)
-- KEYS[2]  the void marks: '<permit id>/<request>' -> until when (see _permits); it exists
--          only for a resend window after a fault
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  the permit id (unique per acquisition; the owner of the permit)
-- ARGV[3]  request id (the permit id makes the call idempotent; a void mark names both)
-- ARGV[4]  the caller's count: the most permits that may be held at once.  While permits are
--          held it must be the count kept with them; with none held, it becomes that count.
-- ARGV[5]  optional: set on a resend, to the client's resend window in ms; the request is then
--          voided for that long (common/_requests)
--
-- Returns {0, 1, lease left} when granted (a resend returns the same grant); {-1, count} when
-- the count kept differs from the caller's (nothing is granted); else the ms until the
-- earliest permit's lease ends (a permit may come back without a release).  A late copy of
-- the call (there is one only after a fault: it was resent, or undone before it arrived)
-- grants nothing: that request is voided.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local lease = tonumber(ARGV[1])
local limit = tonumber(ARGV[4])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local now = drop_expired()

local function attempt()
    local scores = redis.call('ZMSCORE', KEYS[1], ARGV[2], COUNT)
    local ends, kept = tonumber(scores[1]), count_of(scores[2])
    if ends then
        -- A resend: its lease runs from now as the first copy's did (after a stall it must not
        -- answer with a permit about to end).
        if ends < now + lease then
            ends = now + lease
            redis.call('ZADD', KEYS[1], ends, ARGV[2])
            keep(KEYS[1], lease)
        end
        return {0, 1, ends - now}
    end
    if redis.call('ZSCORE', KEYS[2], ARGV[2] .. '/' .. ARGV[3]) then
        return 1  -- a late copy of an acquisition that was undone or voided
    end
    local taken = held()
    if kept and kept ~= limit and taken > 0 then
        return {-1, kept}
    end
    if taken < limit then
        if kept == limit then
            redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
        else  -- the first holder sets the count (or one left by permits that ran out)
            redis.call('ZADD', KEYS[1], now + lease, ARGV[2], COUNT_BASE - limit, COUNT)
        end
        keep(KEYS[1], lease)
        return {0, 1, lease}
    end
    local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return math.max(tonumber(first[2]) - now, 1)
end

local reply = attempt()
if ARGV[5] then  -- a resend: its first copy may still arrive
    void_permit_request(KEYS[2], ARGV[2] .. '/' .. ARGV[3], now, resend_ms(ARGV[5]))
end
return reply
