-- The reentrant hold, shared by the lock kinds whose lock is a hash of hold counts (the plain,
-- spin and fair locks); included by their scripts after common/_time and common/_requests,
-- never run alone.
--
-- The lock hash: <owner> -> hold count, 'f:<owner>' -> that hold's fencing token, 'r:<owner>'
-- -> the last request of the owner applied (owner/request id), for resend safety: every field
-- of a hold is named by its owner, so that a release that is a bare command (HDEL of them,
-- see the plain lock's release in aiolock/_core/release.py) ends that owner's hold and touches no
-- other owner's; 'x:<owner>' -> an acquire
-- request of that owner undone before it was applied, which a late copy must not apply;
-- ':late:<owner>' -> ids of releases of that owner its client resent, whose late copies must
-- not apply (written by the grant or re-entry that carries them, after such a fault only);
-- ':w' -> set by a refusal of a waiter that parks on the lock's channel (the plain lock's), so
-- that the release that deletes this incarnation of the lock publishes only if one may wait.
-- Fencing tokens come from one counter shared by every lock name (a string key that never
-- expires), so no key per name outlives its lock.  A release writes nothing else: the meta
-- hash (see common/_requests) gets markers only on a fault path (a resend, an undo).

-- A fresh hold for owner: a new fencing token.  Returns the grant {token, 1, lease}.  late:
-- the ids of the owner's resent releases the hold must refuse (see optional_args), or nil.
local function grant(lock, fence, owner, request, lease, late)
    local token = redis.call('INCR', fence)
    if late then
        redis.call('HSET', lock, owner, 1, 'f:' .. owner, token, 'r:' .. owner, request,
            ':late:' .. owner, late)
    else
        redis.call('HSET', lock, owner, 1, 'f:' .. owner, token, 'r:' .. owner, request)
    end
    redis.call('PEXPIRE', lock, lease)
    return {token, 1, lease}
end

-- One more hold for an owner that holds the lock, given its fields of the lock hash, {count,
-- last request, token, undone marker} (read by the caller with what else it needs), and the
-- lock's PTTL if read: {token, count, pttl}, nil if it does not hold it, or false for a late
-- copy of a request that was undone before it arrived.  A resend of the applied request
-- counts nothing; the lease is never shortened.  late: as for grant.
local function reenter_read(lock, held, owner, request, lease, pttl, late)
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
        if late then
            redis.call('HSET', lock, owner, count, 'r:' .. owner, request, ':late:' .. owner, late)
        else
            redis.call('HSET', lock, owner, count, 'r:' .. owner, request)
        end
    end
    pttl = pttl or redis.call('PTTL', lock)
    if pttl < lease then
        redis.call('PEXPIRE', lock, lease)
        pttl = lease
    end
    return {tonumber(held[3]), count, pttl}
end

-- Release one hold of owner.  Returns the holds left (nil: the owner holds none), whether
-- this call deleted the lock (the caller then wakes its waiters), whether a waiter was
-- refused by it (':w'), and whether this call released a hold (not a resend, a late copy or
-- an undo that was not applied).  With undo (an acquire request id), release only if that acquire was
-- the last request applied; an undo that was not applied writes a marker for the window its
-- release script got as ARGV[window] (ARGV[4] unless given: the release scripts of these
-- kinds take owner, request, undo, window; the plain lock's has one more before undo).  A resend of a non-last release returns the same count ('r:<owner>' names
-- it); a resend of the release that deleted the lock finds it gone and answers nil, like any release
-- of a hold that is gone: its client knows it resent, and reads that as released (the
-- caller's critical section ended before it sent the release).
--
-- A late copy of a resent release (its resend was applied, and the owner has acquired since:
-- 'r:<owner>' no longer names it) would release the newer hold: the acquire that made or
-- re-entered that hold wrote the release's id to ':late:<owner>', and the copy changes nothing.  It
-- answers the holds left, as a resend does; its caller is gone.  held: those four fields, if
-- the caller read them already.
local function release_one(lock, meta, owner, request, undo, held, window)
    window = ARGV[window or 4]
    held = held or redis.call('HMGET', lock, owner, 'r:' .. owner, ':w', ':late:' .. owner)
    if not held[1] then
        if undo then
            void_request(meta, undo, resend_ms(window))  -- a late copy of it must not grant
        end
        return nil, false
    end
    local count = tonumber(held[1])
    if held[2] == request or late_release(owner, request, held[4]) then
        return count, false
    end
    if undo and held[2] ~= undo then
        -- That acquire was not applied: nothing to undo, and a late copy of it must not apply
        -- either, while the lock lives (the field goes with it) and after.
        redis.call('HSET', lock, 'x:' .. owner, undo)
        void_request(meta, undo, resend_ms(window))
        return count, false
    end
    count = count - 1
    if count > 0 then
        redis.call('HSET', lock, owner, count, 'r:' .. owner, request)
        return count, false, false, true
    end
    redis.call('DEL', lock)
    return 0, true, held[3] ~= false, true
end
