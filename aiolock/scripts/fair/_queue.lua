-- The fair lock's queue helpers, included by the scripts of this folder (not run alone).
--
-- The queue is two sorted sets of waiting owners: KEYS[3] scores each by its ticket (first
-- ask first), KEYS[4] by its deadline in ms of the server's clock.  A try sets it, and the
-- keep-alive of the waiter's client (keep.lua) moves it on; a waiter whose client stopped (its
-- process died) is dropped once its deadline passes and it is next: expiry is lazy, only the
-- head is ever checked, and only while the lock is free (a vanished waiter in the middle
-- delays nobody until it is next).  The hand-off message goes to the next waiter's client
-- only: on the channel KEYS[5] .. <client id>, naming the waiter.  That channel is not a
-- declared key (the next waiter is only known here), but it starts with KEYS[5], which carries
-- the lock's hash tag: it lives in the lock's Cluster slot.  Needs common/_time first.

-- The first live waiter of the queue, dropping at most 100 vanished ones ahead of it (their
-- deadline passed, as of now): returns the owner and its deadline, or nil.
local function live_head(now)
    for _ = 1, 100 do
        local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
        if not first then
            return nil, nil
        end
        local deadline = tonumber(redis.call('ZSCORE', KEYS[4], first))
        if deadline and deadline > now then
            return first, deadline
        end
        redis.call('ZREM', KEYS[3], first)
        redis.call('ZREM', KEYS[4], first)
    end
    local first = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    return first, first and (tonumber(redis.call('ZSCORE', KEYS[4], first)) or now)
end

-- Wake owner: one message, to its client only.
local function wake(owner)
    local client = string.match(owner, '^[^:]*')
    redis.call('PUBLISH', KEYS[5] .. client, owner)
end

-- Tell owner, next in line, that the hold in front of it ends within ms (unless released or
-- renewed): its client parks it no longer than that, so a lease that runs out, which publishes
-- nothing, hands over on time.  The message '+<ms> <owner>' is no hand-off: a client id (the
-- start of an owner id) never starts with '+'.
local function bound(owner, ms)
    local client = string.match(owner, '^[^:]*')
    redis.call('PUBLISH', KEYS[5] .. client, '+' .. ms .. ' ' .. owner)
end

-- Wake the waiter at the head of the queue, if any (the lock has just become free).  Its
-- deadline is not checked here: if it vanished, the keep-alive of a client waiting behind it
-- drops it once its deadline passes (keep.lua), and that client asks again at that time.
local function wake_next()
    local next_owner = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if next_owner then
        wake(next_owner)
    end
end
