-- The fair lock's queue helpers, included by the scripts of this folder (not run alone).
--
-- The queue is a sorted set of waiting owners, KEYS[3], scored by ticket (first ask first),
-- and a hash, KEYS[4], of what each waiter's last try left: '<lease ms> <request n> <wait ms>
-- <deadline>', what a grant from the queue needs (see acquire.lua) and the server time in ms
-- after which the waiter is dropped.  A try sets the deadline, and the keep-alive of the
-- waiter's client (keep.lua) moves it on; a waiter whose client stopped (its process died) is
-- dropped once its deadline passes and it is next: expiry is lazy, only the head is ever
-- checked, and only while the lock is free (a vanished waiter in the middle delays nobody
-- until it is next).  An owner enters and leaves both keys together, and they expire together.
-- The hand-off message goes to the next waiter's client only: on the channel KEYS[5] .. <client
-- id>, naming the waiter.  That channel is not a declared key (the next waiter is only known
-- here), but it starts with KEYS[5], which carries the lock's hash tag: it lives in the lock's
-- Cluster slot.  Needs common/_time first.

-- A waiter's entry in KEYS[4]: lease ms, request n, wait ms, deadline (numbers), or nil.
local function waiter_args(entry)
    local ms, n, wait, deadline = string.match(entry or '', '^(%d+) (%d+) (%d+) (%d+)$')
    if not ms then
        return nil
    end
    return tonumber(ms), n, tonumber(wait), tonumber(deadline)
end

-- The first live waiter of the queue, dropping at most 100 vanished ones ahead of it (their
-- deadline passed, as of now): returns the owner, its deadline, its entry, and whether the
-- caller took it out of the queue already, or nil.  head: the head of the queue, if the caller
-- read it already; ticket: the caller took that head out of the queue too (ZPOPMIN), and this
-- was its ticket.
local function live_head(now, head, ticket)
    for i = 1, 101 do
        local first = head or redis.call('ZRANGE', KEYS[3], 0, 0)[1]
        local taken = head ~= nil and ticket ~= nil
        head = nil
        if not first then
            return nil
        end
        local entry = redis.call('HGET', KEYS[4], first)
        local _, _, _, deadline = waiter_args(entry)
        if (deadline and deadline > now) or i == 101 then
            return first, deadline or now, entry, taken
        end
        if not taken then
            redis.call('ZREM', KEYS[3], first)
        end
        redis.call('HDEL', KEYS[4], first)
    end
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

-- Wake the waiter at the head of the queue, if any, without granting it the lock (force.lua:
-- a grant could reach the forcing client's own waiter before the force's reply, which then
-- takes every hold of the lock in that client for lost).  Its deadline is not checked here: if
-- it vanished, the keep-alive of a client waiting behind it drops it once its deadline passes
-- (keep.lua), and hands the lock over then.
local function wake_next()
    local next_owner = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
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
-- Vanished waiters at the head are dropped first (their deadline passed).
local function hand_over(now, first, ticket)
    local head, _, entry, taken = live_head(now, first, ticket)
    if not head then
        return
    end
    local ms, n, wait = waiter_args(entry)
    if not ms or ms < 1 then
        if taken then
            redis.call('ZADD', KEYS[3], ticket, head)  -- it stays in line, at its place
        end
        wake(head)
        return
    end
    if not taken then
        redis.call('ZREM', KEYS[3], head)
    end
    redis.call('HDEL', KEYS[4], head)
    -- A hold as common/_hold.lua's grant() makes it, with ':q' in the same write.
    local token = redis.call('INCR', KEYS[6])
    redis.call('HSET', KEYS[1], head, 1, 'f:' .. head, token, 'r:' .. head, head .. '/' .. n,
        ':q', n)
    redis.call('PEXPIRE', KEYS[1], ms)
    local client = string.match(head, '^[^:]*')
    redis.call('PUBLISH', KEYS[5] .. client,
        '=' .. token .. ' ' .. ms .. ' ' .. now .. ' ' .. n .. ' ' .. head)
    -- As acquire.lua's grant from the queue: a lease shorter than the wait timeout may end
    -- before the keep-alive of the next in line sees it.
    local next_owner = ms < wait and redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    if next_owner then
        bound(next_owner, ms)
    end
end
