-- The read-write lock's state, included by its scripts (not run alone).  Every script takes
-- the same keys:
--
-- KEYS[1]  the lock hash: 'w' -> the writer's owner id, 'wc' -> its hold count, 'r:<owner>' ->
--          a reader's hold count, 'q:<owner>' -> the last request applied for that owner,
--          ':fence' -> the current write hold's fencing token
-- KEYS[2]  the meta hash: 'next' -> fencing token counter, 'released' -> the request that
--          last deleted the lock
-- KEYS[3]  the readers: owner -> its read lease end (server ms); 'owner/request' -> minus the
--          time until which a resend of that owner's last read release is recognised
-- KEYS[4]  the waiting writers: owner -> the server ms after which it no longer waits
-- KEYS[5]  the readers' channel (a write release wakes them all)
-- KEYS[6]  the writers' channel (a release that frees the lock wakes one writer)

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drop the readers whose lease ended (their holds go), old resend marks, and writers that
-- stopped waiting.
local function expire(now)
    local gone = redis.call('ZRANGEBYSCORE', KEYS[3], 0, now)
    local writer = redis.call('HGET', KEYS[1], 'w')
    for _, owner in ipairs(gone) do
        redis.call('HDEL', KEYS[1], 'r:' .. owner)
        if owner ~= writer then
            redis.call('HDEL', KEYS[1], 'q:' .. owner)
        end
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '(' .. -now, now)
    redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end

local function live_readers(now)
    return redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
end

local function waiting_writers()
    return redis.call('ZCARD', KEYS[4])
end

-- Keep key alive at least ms longer: the lock lives as long as its longest hold.
local function keep(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, ms)
    end
end

-- The write hold ended: wake one writer (of each client: a client's writers queued behind
-- its first are not registered here), and every reader unless a registered writer goes first.
local function wake_after_write()
    redis.call('PUBLISH', KEYS[6], 'free')
    if waiting_writers() == 0 then
        redis.call('PUBLISH', KEYS[5], 'free')
    end
end

-- Nobody holds it any more: delete it and wake the next.
local function free(request)
    redis.call('DEL', KEYS[1], KEYS[3])
    redis.call('HSET', KEYS[2], 'released', request)
    wake_after_write()
end

-- The watchdog's batch: KEYS[2i-1], KEYS[2i] are the lock hash and readers set of the i-th
-- hold, ARGV[i+1] its owner; mode 'r' renews read holds, 'w' write holds.  Returns 1 per
-- hold renewed, 0 per hold no longer held in that mode.  A longer lease already set is kept.
local function renew(mode, lease)
    local now = now_ms()
    local renewed = {}
    for i = 1, #ARGV - 1 do
        local lock, readers, owner = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
        local ok
        if mode == 'w' then
            ok = redis.call('HGET', lock, 'w') == owner
        else
            local ends = tonumber(redis.call('ZSCORE', readers, owner))
            ok = ends ~= nil and ends > now and redis.call('HEXISTS', lock, 'r:' .. owner) == 1
            if ok then
                if ends < now + lease then
                    redis.call('ZADD', readers, now + lease, owner)
                end
                keep(readers, lease)
            end
        end
        if ok then
            keep(lock, lease)
        end
        renewed[i] = ok and 1 or 0
    end
    return renewed
end
