-- The reentrant hold, shared by the lock kinds whose lock is a hash of hold counts (the plain,
-- spin and fair locks); included by their scripts after common/_time and common/_requests,
-- never run alone.
--
-- The lock hash: <owner> -> hold count, ':fence' -> the current hold's fencing token, ':req'
-- -> the last request applied (owner/request id), for resend safety; 'x:<owner>' -> an acquire
-- request of that owner undone before it was applied, which a late copy must not apply.
-- Fencing tokens come from one counter shared by every lock name (a string key that never
-- expires), so no key per name outlives its lock.  The meta hash (see common/_requests)
-- outlives the lock only for a while.

-- A fresh hold for owner: a new fencing token.  Returns the grant {token, 1, lease}.
local function grant(lock, fence, owner, request, lease)
    local token = redis.call('INCR', fence)
    redis.call('HSET', lock, owner, 1, ':fence', token, ':req', request)
    redis.call('PEXPIRE', lock, lease)
    return {token, 1, lease}
end

-- reenter, given the owner's fields of the lock hash, {count, last request, token, undone
-- marker} (a caller that has read them already saves a command).
local function reenter_read(lock, held, owner, request, lease)
    if not held[1] then
        return nil
    end
    if held[4] == request then
        return false
    end
    if older(owner, request, held[2]) then
        return false
    end
    local count = tonumber(held[1])
    if held[2] ~= request then
        count = count + 1
        redis.call('HSET', lock, owner, count, ':req', request)
    end
    local pttl = redis.call('PTTL', lock)
    if pttl < lease then
        redis.call('PEXPIRE', lock, lease)
        pttl = lease
    end
    return {tonumber(held[3]), count, pttl}
end

-- One more hold for an owner that holds the lock: {token, count, pttl}, nil if it does not
-- hold it, or false for a late copy of a request that was undone before it arrived.  A resend
-- of the applied request counts nothing; the lease is never shortened.
local function reenter(lock, owner, request, lease)
    local held = redis.call('HMGET', lock, owner, ':req', ':fence', 'x:' .. owner)
    return reenter_read(lock, held, owner, request, lease)
end

-- Release one hold of owner.  Returns the holds left (nil: the owner holds none) and whether
-- this call deleted the lock (the caller then wakes its waiters).  With undo (an acquire
-- request id), release only if that acquire was the last request applied.  Idempotent per
-- request: a resend returns the same count and deletes nothing.
local function release_one(lock, meta, owner, request, undo)
    local held = redis.call('HMGET', lock, owner, ':req')
    if not held[1] then
        if undo then
            fence_off(meta, undo)  -- a late copy of it must not grant
        elseif redis.call('HGET', meta, 'released') == request then
            return 0, false
        end
        return nil, false
    end
    local count = tonumber(held[1])
    if held[2] == request then
        return count, false
    end
    if undo and held[2] ~= undo then
        -- That acquire was not applied: nothing to undo, and a late copy of it must not apply
        -- either, while the lock lives (the field goes with it) and after.
        redis.call('HSET', lock, 'x:' .. owner, undo)
        fence_off(meta, undo)
        return count, false
    end
    count = count - 1
    if count > 0 then
        redis.call('HSET', lock, owner, count, ':req', request)
        return count, false
    end
    -- A resend of this release that comes after the lease would have ended anyway is answered
    -- 'not held', as the lease would have answered it: the marker lives as long as the lease.
    local pttl = redis.call('PTTL', lock)
    redis.call('DEL', lock)
    mark(meta, 'released', request, math.max(pttl, 1000))
    return 0, true
end
