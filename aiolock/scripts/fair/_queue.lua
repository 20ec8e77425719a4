-- The fair lock's queue helpers, included by the scripts of this folder (not run alone).
--
-- The queue is a sorted set of waiting owners, QUEUE, scored by ticket (first ask first), and a
-- hash, QUEUED, of what each waiter's last try left: '<lease ms> <request n> <wait ms>
-- <deadline>', what a grant from the queue needs (see acquire.lua) and the server time in ms
-- until which that try alone keeps the waiter in line.  After it, a waiter is live while its
-- client is: while the client's alive key, ALIVE .. <client id>, exists (one key per client and
-- Cluster slot, set for the wait timeout by the client's keep-alive, keep.lua, every half of
-- it while the client has parked waiters there).  A waiter that is neither is dropped once it
-- is next: expiry is lazy, only the head is ever checked, and only while the lock is free (a
-- vanished waiter in the middle delays nobody until it is next).  An owner enters and leaves
-- both keys together, and they expire together (ten wait timeouts after the last try or
-- keep-alive that armed them: they outlive their last live waiter only after a fault).
-- The hand-off message goes to the next waiter's client only: on the channel WAKE .. <client
-- id>, naming the waiter.  That channel and the alive keys are not declared keys (the next
-- waiter is only known here), but WAKE and ALIVE, passed as keys, carry the lock's Cluster
-- slot: what they prefix lives in it.  Needs common/_time first.

-- The keys the helpers work on: a fair script's KEYS[1] and KEYS[3..7].  keep.lua, which
-- keeps many locks in one call, points them at each lock in turn.
local LOCK, QUEUE, QUEUED, WAKE, FENCE, ALIVE = KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
    KEYS[7]

-- How long the queue's keys live after a try or keep-alive arms them, in wait timeouts; a
-- keep-alive arms them again when less than QUEUE_REARM wait timeouts are left.
local QUEUE_TTL, QUEUE_REARM = 10, 6

-- A waiter's entry in QUEUED: lease ms, request n, wait ms, deadline (numbers), or nil.
local function waiter_args(entry)
    local ms, n, wait, deadline = string.match(entry or '', '^(%d+) (%d+) (%d+) (%d+)$')
    if not ms then
        return nil
    end
    return tonumber(ms), n, tonumber(wait), tonumber(deadline)
end

-- The first live waiter of the queue, dropping at most 100 vanished ones ahead of it (its try's
-- deadline passed and its client's alive key is gone, as of now): returns the owner, the
-- server time in ms until which it is surely live, its entry, and whether the caller took it
-- out of the queue already, or nil.  head: the head of the queue, if the caller read it
-- already; ticket: the caller took that head out of the queue too (ZPOPMIN), and this was its
-- ticket.
local function live_head(now, head, ticket)
    for i = 1, 101 do
        local first = head or redis.call('ZRANGE', QUEUE, 0, 0)[1]
        local taken = head ~= nil and ticket ~= nil
        head = nil
        if not first then
            return nil
        end
        local entry = redis.call('HGET', QUEUED, first)
        local _, _, _, deadline = waiter_args(entry)
        if deadline and deadline <= now then
            -- Past its try's deadline: live while its client keeps its alive key.
            local alive = redis.call('PTTL', ALIVE .. string.match(first, '^[^:]*'))
            deadline = alive > 0 and now + alive or nil
        end
        if deadline or i == 101 then
            return first, deadline or now, entry, taken
        end
        if not taken then
            redis.call('ZREM', QUEUE, first)
        end
        redis.call('HDEL', QUEUED, first)
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

-- Wake the waiter at the head of the queue, if any, without granting it the lock (force.lua:
-- a grant could reach the forcing client's own waiter before the force's reply, which then
-- takes every hold of the lock in that client for lost).  Whether it is live is not checked
-- here: if it vanished, the keep-alive of a client waiting behind it drops it once it is no
-- longer live (keep.lua), and hands the lock over then.
local function wake_next()
    local next_owner = redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if next_owner then
        wake(next_owner)
    end
end

-- The lock has just become free (released, withdrawn from, or found free by a keep-alive):
-- grant it to the first live waiter of the queue itself, so that the waiter starts with no
-- further call, and tell its client so in one message, '=<token> <lease ms> <server time ms>
-- <request n> <owner>' (a client id never starts with '=').  The lock hash marks such a grant
-- with ':q' = n until the owner's client takes it as its own by a try (acquire.lua): the
-- message may be lost, or come after the waiter gave up (its withdraw then takes the grant
-- back, withdraw.lua).  The lease is the one the waiter's last try asked for, at most the
-- wait timeout: a waiter that vanished blocks the lock no longer than a vanished head does.
-- A waiter whose try asked for no grant from the queue (lease 0: a fault path) is only woken.
-- Vanished waiters at the head are dropped first (see live_head).
local function hand_over(now, first, ticket)
    local head, _, entry, taken = live_head(now, first, ticket)
    if not head then
        return
    end
    local ms, n, wait = waiter_args(entry)
    if not ms or ms < 1 then
        if taken then
            redis.call('ZADD', QUEUE, ticket, head)  -- it stays in line, at its place
        end
        wake(head)
        return
    end
    if not taken then
        redis.call('ZREM', QUEUE, head)
    end
    redis.call('HDEL', QUEUED, head)
    -- A hold as common/_hold.lua's grant() makes it, with ':q' in the same write.
    local token = redis.call('INCR', FENCE)
    redis.call('HSET', LOCK, head, 1, 'f:' .. head, token, 'r:' .. head, head .. '/' .. n,
        ':q', n)
    redis.call('PEXPIRE', LOCK, ms)
    local client = string.match(head, '^[^:]*')
    redis.call('PUBLISH', WAKE .. client,
        '=' .. token .. ' ' .. ms .. ' ' .. now .. ' ' .. n .. ' ' .. head)
    -- As acquire.lua's grant from the queue: a lease shorter than the wait timeout may end
    -- before the keep-alive of the next in line sees it.
    local next_owner = ms < wait and redis.call('ZRANGE', QUEUE, 0, 0)[1]
    if next_owner then
        bound(next_owner, ms)
    end
end
