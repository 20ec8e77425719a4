-- The read-write lock's state, included by its scripts after common/_time and common/_requests
-- (not run alone).  Every script takes the same keys:
--
-- KEYS[1]  the lock hash: 'w' -> the writer's owner id, 'wc' -> its hold count, 'we' -> the
--          server ms at which its lease ends; 'r:<owner>' -> a reader's hold count,
--          't:<owner>' -> its read token; 'q:<owner>' -> the last request applied for that
--          owner, 'x:<owner>' -> its last acquire undone before it arrived, ':late:<owner>'
--          -> ids of its releases that its client resent, whose late copies must not apply
--          (written by an acquire that carries them, after such a fault only; all three there
--          while the owner holds the lock); ':fence' -> the write hold's fencing token
-- KEYS[2]  the meta hash: '<owner>/<n>' -> an acquire undone before it arrived or voided
--          by its client, for the client's resend window (see common/_requests); written on
--          those fault paths only
-- KEYS[3]  the readers: owner -> its read lease end (server ms); negative scores are marks of
--          earlier versions, dropped past their time
-- KEYS[4]  the waiting writers: owner -> the server ms after which it no longer waits
-- KEYS[5]  the readers' channel (a write release wakes them all)
-- KEYS[6]  the writers' channel (a release that frees the lock wakes one writer)
-- KEYS[7]  the fencing token counter (read and write tokens), shared by every lock name
--
-- Every hold has its own lease; the hash lives exactly as long as its longest live hold, and
-- the last release deletes it with the readers set, leaving nothing behind.  A release script
-- takes owner, request, and on an undo the acquire request and the client's resend window;
-- an acquire script takes lease, owner, request, one more of its own, and the optional
-- ARGV of common/_requests' optional_args (a late copy's ids, a resend's mark).

-- Whether request is a late copy the owner must not get (see common/_requests): an acquire
-- its client undid before it arrived ('x:<owner>' while the owner holds the lock, the meta
-- hash's marker after), or one older than last, the owner's last request applied (or, once
-- the lock is gone, than the owner's release that deleted it).
local function late_copy(owner, request, last, burnt)
    if burnt == request or older(owner, request, last) then
        return true
    end
    return not last and stale(KEYS[2], owner, request)
end

-- An acquire that owner's client undid was not applied: a late copy of it must not apply
-- either, while the owner holds the lock (holding) and after.
local function burn(owner, undo, holding)
    if holding then
        redis.call('HSET', KEYS[1], 'x:' .. owner, undo)
    end
    void_request(KEYS[2], undo, resend_ms(ARGV[4]))
end

-- The owner holds nothing any more: drop what the lock kept for it.
local function forget(owner)
    redis.call('HDEL', KEYS[1], 'q:' .. owner, 'x:' .. owner, ':late:' .. owner)
end

-- Record request as the owner's last one applied, with the ids of its resent releases whose
-- late copies must not apply (late: see optional_args; nil on the fault-free path), and
-- more field/value pairs to set in the same HSET.
local function applied(owner, request, late, ...)
    if late then
        redis.call('HSET', KEYS[1], 'q:' .. owner, request, ':late:' .. owner, late, ...)
    else
        redis.call('HSET', KEYS[1], 'q:' .. owner, request, ...)
    end
end

-- Drop the holds whose lease ended, old resend marks, and writers that stopped waiting.
local function expire(now)
    local gone = redis.call('ZRANGEBYSCORE', KEYS[3], 0, now)
    local writer, write_ends = unpack(redis.call('HMGET', KEYS[1], 'w', 'we'))
    if writer and tonumber(write_ends) <= now then
        redis.call('HDEL', KEYS[1], 'w', 'wc', 'we', ':fence')
        if not redis.call('HGET', KEYS[1], 'r:' .. writer) then
            forget(writer)
        end
        writer = nil
    end
    for _, owner in ipairs(gone) do
        redis.call('HDEL', KEYS[1], 'r:' .. owner, 't:' .. owner)
        if owner ~= writer then
            forget(owner)
        end
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '(' .. -now, now)
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end

-- The owner's read holds end no earlier than now + lease (never shortened); returns when.
local function lengthen(owner, now, lease)
    local ends = tonumber(redis.call('ZSCORE', KEYS[3], owner))
    if not ends or ends < now + lease then
        ends = now + lease
        redis.call('ZADD', KEYS[3], ends, owner)
    end
    return ends
end

local function live_readers(now)
    return redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
end

local function waiting_writers()
    return redis.call('ZCARD', KEYS[4])
end

-- The ms until the last live read hold ends (0: none).
local function read_left(now)
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    return math.max((tonumber(last) or 0) - now, 0)
end

-- The ms until the write hold ends (0: none).
local function write_left(now)
    return math.max((tonumber(redis.call('HGET', KEYS[1], 'we')) or 0) - now, 0)
end

-- Set the keys' lifetime to the longest live hold's; none left: delete them.
local function retime(now)
    local left = math.max(read_left(now), write_left(now))
    if left > 0 then
        redis.call('PEXPIRE', KEYS[1], left)
        redis.call('PEXPIRE', KEYS[3], left)
    else
        redis.call('DEL', KEYS[1], KEYS[3])
    end
end

-- The write hold ended: wake one writer (of each client: a client's writers queued behind its
-- first are not registered here), and every reader unless a registered writer goes first.
local function wake_after_write()
    redis.call('PUBLISH', KEYS[6], 'free')
    if waiting_writers() == 0 then
        redis.call('PUBLISH', KEYS[5], 'free')
    end
end

-- Nobody holds it any more: delete it and wake the next.  No marker: a resend of this release
-- finds nothing and answers nil, which its client (it knows it resent) takes for released.
local function free()
    redis.call('DEL', KEYS[1], KEYS[3])
    wake_after_write()
end

-- The watchdog's batch: KEYS[2i-1], KEYS[2i] are the lock hash and readers set of the i-th
-- hold, ARGV[i+1] its owner; mode 'r' renews read holds, 'w' write holds.  Returns 1 per hold
-- renewed, 0 per hold no longer held in that mode.  A longer lease already set is kept.
local function renew(mode, lease)
    local now = now_ms()
    local renewed = {}
    for i = 1, #ARGV - 1 do
        local lock, readers, owner = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
        local ends, ok
        if mode == 'w' then
            local writer, write_ends = unpack(redis.call('HMGET', lock, 'w', 'we'))
            ends = tonumber(write_ends)
            ok = writer == owner and ends > now
            if ok and ends < now + lease then
                redis.call('HSET', lock, 'we', now + lease)
            end
        else
            ends = tonumber(redis.call('ZSCORE', readers, owner))
            ok = ends ~= nil and ends > now and redis.call('HEXISTS', lock, 'r:' .. owner) == 1
            if ok and ends < now + lease then
                redis.call('ZADD', readers, now + lease, owner)
            end
        end
        if ok then
            keep(lock, lease)
            keep(readers, lease)
        end
        renewed[i] = ok and 1 or 0
    end
    return renewed
end
