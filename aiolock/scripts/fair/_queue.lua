-- The fair lock's queue helpers, included by the scripts of this folder (not run alone).
--
-- The queue, QUEUE, is a list of waiters, first in line at the head: a try pushes its member at
-- the tail (RPUSH), so the order is the order in which the server applied the tries, whatever
-- the clients' clocks.  A member is '<lease ms> <request n> <wait ms> <deadline> <owner>': what
-- a grant from the queue needs (see acquire.lua), the server time in ms until which the try
-- that queued it keeps it in line, and the owner last (an explicit owner may hold spaces).
-- After that deadline a waiter is live while its client is: while the client's alive key,
-- ALIVE .. <client id>, exists (one key per client and Cluster slot, set for the wait timeout
-- by the client's keep-alive, keep.lua, every half of it while the client has parked waiters
-- there).  A waiter that is neither is dropped once it is next: expiry is lazy, only the head
-- is ever checked, and only while the lock is free (a vanished waiter in the middle delays
-- nobody until it is next).  The list expires QUEUE_TTL wait timeouts after it was last
-- armed: by the try that made it, by a keep-alive that checks its owners, and by one grant
-- from the queue in four (see hand_over); it outlives its last live waiter only after a fault.
-- The hand-off message goes to the next waiter's client only: on the channel WAKE .. <client
-- id>, naming the waiter.  That channel and the alive keys are not declared keys (the next
-- waiter is only known here), but WAKE and ALIVE, passed as keys, carry the lock's Cluster
-- slot: what they prefix lives in it.  Needs common/_time first.

-- The keys the helpers work on: a fair script's KEYS[1] and KEYS[3..6].  keep.lua, which
-- keeps many locks in one call, points them at each lock in turn.
local LOCK, QUEUE, WAKE, FENCE, ALIVE = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6]

-- How long the queue lives after it is armed, in wait timeouts; a keep-alive arms it again
-- when less than QUEUE_REARM wait timeouts are left.
local QUEUE_TTL, QUEUE_REARM = 60, 40

-- A member's lease ms, request n, wait ms, deadline (numbers but n) and owner, or nil.
local function parse(member)
    local ms, n, wait, deadline, owner =
        string.match(member or '', '^(%d+) (%d+) (%d+) (%d+) (.+)$')
    if not ms then
        return nil
    end
    return tonumber(ms), n, tonumber(wait), tonumber(deadline), owner
end

-- A member's owner, or nil.
local function owner_of(member)
    return string.match(member or '', '^%d+ %d+ %d+ %d+ (.+)$')
end

-- The members of owner in the queue, and the index of the first of them (0: the head), or
-- nil.  O(n): only a call that may have a member already looks (not a call's first try).
local function members_of(owner)
    local found, first = {}, nil
    for i, member in ipairs(redis.call('LRANGE', QUEUE, 0, -1)) do
        if owner_of(member) == owner then
            found[#found + 1] = member
            first = first or i - 1
        end
    end
    return found, first
end

-- Put member back at the head (a waiter only woken keeps its place); a queue the pop emptied
-- was deleted, and is armed again.
local function put_back(member, wait)
    if redis.call('LPUSH', QUEUE, member) == 1 then
        redis.call('PEXPIRE', QUEUE, QUEUE_TTL * wait)
    end
end

-- Take the first live waiter out of the queue, dropping at most 100 vanished ones ahead of it
-- (its try's deadline passed and its client's alive key is gone, as of now): returns its
-- member and the server time in ms until which it is surely live, or nil.  first: the head,
-- if the caller popped it already.
local function live_head(now, first)
    for i = 1, 101 do
        local member = first or redis.call('LPOP', QUEUE)
        first = nil
        if not member then
            return nil
        end
        local _, _, _, deadline, owner = parse(member)
        if deadline and deadline <= now then
            -- Past its try's deadline: live while its client keeps its alive key.
            local alive = redis.call('PTTL', ALIVE .. string.match(owner, '^[^:]*'))
            deadline = alive > 0 and now + alive or nil
        end
        if deadline or (owner and i == 101) then
            return member, deadline or now
        end
    end
end

-- Wake owner: one message, to its client only.
local function wake(owner)
    local client = string.match(owner, '^[^:]*')
    redis.call('PUBLISH', WAKE .. client, owner)
end

-- Tell owner, next in line, that the hold in front of it ends within ms (unless released or
-- renewed): its client parks it no longer than that, so a lease that runs out, which publishes
-- nothing, hands over on time.  The message '+<ms> <owner>' is no hand-off: a client id (the
-- start of an owner id) never starts with '+'.
local function bound(owner, ms)
    local client = string.match(owner, '^[^:]*')
    redis.call('PUBLISH', WAKE .. client, '+' .. ms .. ' ' .. owner)
end

-- After a grant with a lease of ms: a lease shorter than the wait timeout may end before the
-- keep-alive of the next in line looks at the lock (at least once a wait timeout), so the
-- next in line is told when it ends.
local function bound_next(ms, wait)
    local next_owner = ms < wait and owner_of(redis.call('LINDEX', QUEUE, 0))
    if next_owner then
        bound(next_owner, ms)
    end
end

-- Wake the waiter at the head of the queue, if any, without granting it the lock (force.lua:
-- a grant could reach the forcing client's own waiter before the force's reply, which then
-- takes every hold of the lock in that client for lost).  Whether it is live is not checked
-- here: if it vanished, the keep-alive of a client waiting behind it drops it once it is no
-- longer live (keep.lua), and hands the lock over then.
local function wake_next()
    local next_owner = owner_of(redis.call('LINDEX', QUEUE, 0))
    if next_owner then
        wake(next_owner)
    end
end

-- The lock has just become free (released, withdrawn from, or found free by a keep-alive):
-- grant it to the first live waiter of the queue itself, so that the waiter starts with no
-- further call, and tell its client so in one message, '=<token> <lease ms> <server time ms>
-- <request n> <owner>' (a client id never starts with '=').  now: the server's time in ms,
-- or a lower bound of it (the releasing client's: the waiter counts the lease from it).  The
-- lock hash marks such a grant with 'q:<owner>' = n, for as long as the hold lasts unless the
-- owner's client takes it as its own by a try (acquire.lua): the message may be lost, or come
-- after the waiter gave up (its withdraw then takes the grant back, withdraw.lua).  The lease is the one the waiter's last
-- try asked for, at most the wait timeout: a waiter that vanished blocks the lock no longer
-- than a vanished head does.  A waiter whose try asked for no grant from the queue (lease 0:
-- a fault path) is only woken, and keeps its place.  Vanished waiters at the head are dropped
-- first (see live_head); first: the head, if the caller popped it already.  Returns the
-- server time until which a head only woken is surely live, else nil.
local function hand_over(now, first)
    local head, live_until = live_head(now, first)
    if not head then
        return nil
    end
    local ms, n, wait, _, owner = parse(head)
    if ms < 1 then
        put_back(head, wait)
        wake(owner)
        return live_until
    end
    -- A hold as common/_hold.lua's grant() makes it, with 'q:<owner>' in the same write.
    local token = redis.call('INCR', FENCE)
    redis.call('HSET', LOCK, owner, 1, 'f:' .. owner, token, 'r:' .. owner, owner .. '/' .. n,
        'q:' .. owner, n)
    redis.call('PEXPIRE', LOCK, ms)
    local client = string.match(owner, '^[^:]*')
    redis.call('PUBLISH', WAKE .. client,
        '=' .. token .. ' ' .. ms .. ' ' .. now .. ' ' .. n .. ' ' .. owner)
    bound_next(ms, wait)
    -- A queue that never empties must not expire under its waiters, whose clients check it
    -- only once they waited two timeouts: one grant in four arms it again (a no-op on an
    -- emptied queue).  A queue whose waiters all wait less than that grants at least once
    -- every two timeouts, so it misses every re-arm of its QUEUE_TTL with odds of (3/4)^30.
    if now % 4 == 0 then
        redis.call('PEXPIRE', QUEUE, QUEUE_TTL * wait)
    end
    return nil
end
