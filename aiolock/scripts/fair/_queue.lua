-- The fair lock's queue helpers, included by the scripts of this folder (not run alone).
--
-- The queue is two sorted sets of waiting owners: KEYS[3] scores each by its ticket (first
-- ask first), KEYS[4] by its deadline in ms of the server's clock.  A live waiter moves its
-- deadline on with every try; one that stopped trying (its process died) is dropped once its
-- deadline passes.  The hand-off message goes to the next waiter's client only: on the
-- channel KEYS[5] .. <client id>, naming the waiter.  That channel is not a declared key (the
-- next waiter is only known here), but it starts with KEYS[5], which carries the lock's hash
-- tag: it lives in the lock's Cluster slot.  Needs common/_time included first.

-- Drop waiters whose deadline passed (at most 100 a call); returns how many went.
local function drop_vanished(now)
    local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 100)
    if #gone > 0 then
        redis.call('ZREM', KEYS[3], unpack(gone))
        redis.call('ZREM', KEYS[4], unpack(gone))
    end
    return #gone
end

-- The owner at the head of the queue, or nil.
local function head()
    return redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end

-- Wake the waiter at the head of the queue, if any: one message, to its client only.
local function wake_next(now)
    drop_vanished(now)
    local next_owner = head()
    if next_owner then
        local client = string.match(next_owner, '^[^:]*')
        redis.call('PUBLISH', KEYS[5] .. client, next_owner)
    end
end
