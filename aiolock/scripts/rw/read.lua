-- Take a read hold of a read-write lock (see _rw.lua for the seven KEYS).
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]  lease in milliseconds (this owner's read holds end no earlier than now + lease)
-- ARGV[2]  owner id
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  unused (the writers' wait timeout, taken by the write script)
-- ARGV[5..] optional, neither there on the fault-free path: 'late:<ids>', releases of this
--          owner its client resent lately, whose late copies its holds must refuse (kept as
--          ':late:<owner>', see _rw.lua); and last, set on a resend, the client's resend window
--          in ms, for which the request is then voided (common/_requests)
--
-- Returns {token, read count, ms until this owner's read holds end} when granted (a fresh
-- read hold gets a new token; a reentrant one shares it), else the ms to wait before trying
-- again.  Readers of other owners wait while a writer holds the lock or waits for it (writers
-- are not starved); an owner that reads or writes already is granted at once.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local owner = ARGV[2]
local request = owner .. '/' .. ARGV[3]
local late, resent = optional_args(5)
local function attempt()
    local now = now_ms()
    expire(now)

    local held = redis.call('HMGET', KEYS[1], 'w', 'r:' .. owner, 'q:' .. owner, 't:' .. owner,
        'x:' .. owner)
    if held[3] == request and held[2] then
        -- A resend counts nothing, but its lease runs from now as the first copy's did: a resend
        -- that comes after a stall must not answer with a hold about to end.
        local ends = lengthen(owner, now, lease)
        retime(now)
        return {tonumber(held[4]), tonumber(held[2]), ends - now}
    end
    if late_copy(owner, request, held[3], held[5]) then
        return 1  -- its caller is gone
    end
    if held[1] and held[1] ~= owner then
        return math.max(write_left(now), 1)
    end
    if not held[1] and not held[2] and waiting_writers() > 0 then
        -- A writer waits: queue behind it, until it has had its turn or stopped waiting.
        local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
        return math.max(tonumber(first[2]) - now, 1)
    end

    local token = tonumber(held[4])
    if not token then
        token = redis.call('INCR', KEYS[7])
        redis.call('HSET', KEYS[1], 't:' .. owner, token)
    end
    local count = redis.call('HINCRBY', KEYS[1], 'r:' .. owner, 1)
    applied(owner, request, late)
    local ends = lengthen(owner, now, lease)
    retime(now)
    return {token, count, ends - now}
end

local reply = attempt()
if resent then  -- a resend: its first copy may still arrive
    void_request(KEYS[2], request, resend_ms(resent))
end
return reply
