-- Take the write hold of a read-write lock, or wait for it (see _rw.lua for the seven KEYS).
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  how long (ms) a waiting writer holds readers back without trying again
-- ARGV[5..] optional, as for read.lua: 'late:<ids>', releases of this owner its client resent
--          lately, whose late copies its holds must refuse; and last, set on a resend, the
--          client's resend window in ms, for which the request is then voided
--
-- Returns {fencing token, write count, ms until the write hold ends} when granted, else the
-- ms to wait before trying again (the writer then holds back new readers of other owners until
-- ARGV[4] has passed since its last try).  An owner that reads and does not write gets an
-- error: an upgrade could deadlock.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local lease = tonumber(ARGV[1])
local wait = tonumber(ARGV[4])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local owner = ARGV[2]
local request = owner .. '/' .. ARGV[3]
local late, resent = optional_args(5)
local function attempt()
    local now = now_ms()
    expire(now)

    local held = redis.call('HMGET', KEYS[1], 'w', 'wc', 'r:' .. owner, 'q:' .. owner, ':fence',
        'we', 'x:' .. owner)
    if held[4] ~= request and late_copy(owner, request, held[4], held[7]) then
        return 1  -- its caller is gone
    end
    if held[1] == owner then
        local count, ends = tonumber(held[2]), tonumber(held[6])
        if held[4] ~= request then  -- else a resend: it counts nothing
            count = count + 1
            applied(owner, request, late, 'wc', count)
        end
        -- The lease runs from now, never shortened (also for a resend that comes after a stall:
        -- it must not answer with a hold about to end).
        if ends < now + lease then
            ends = now + lease
            redis.call('HSET', KEYS[1], 'we', ends)
        end
        retime(now)
        return {tonumber(held[5]), count, ends - now}
    end
    if held[3] then
        return redis.error_reply('ERR aiolock: upgrade refused: the owner holds the read lock')
    end
    if held[1] or live_readers(now) > 0 then
        redis.call('ZADD', KEYS[4], now + wait, owner)
        keep(KEYS[4], 2 * wait)
        local left = math.max(write_left(now), read_left(now))
        return math.max(math.min(math.floor(wait / 3), left > 0 and left or wait), 1)
    end

    redis.call('ZREM', KEYS[4], owner)
    local token = redis.call('INCR', KEYS[7])
    applied(owner, request, late, 'w', owner, 'wc', 1, 'we', now + lease, ':fence', token)
    retime(now)
    return {token, 1, lease}
end

local reply = attempt()
if resent then  -- a resend: its first copy may still arrive
    void_request(KEYS[2], request, resend_ms(resent))
end
return reply
