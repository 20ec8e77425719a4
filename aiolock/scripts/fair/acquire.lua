-- Acquire or re-enter a fair lock, or take (and keep) a place in its queue.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, 'f:<owner>' -> token, 'r:<owner>' -> its last
--          request (see common/_hold.lua); 'q:<owner>' marks a grant from the queue not yet taken
-- KEYS[2]  the meta hash: '<owner>/<n>' -> an acquire undone before it arrived or voided
--          (see common/_requests.lua); it exists only for a resend window after a fault
-- KEYS[3]  the queue: a list of '<lease ms> <request n> <wait ms> <deadline> <owner>', what a
--          grant from the queue needs (see hand_over in _queue.lua) and the server time in ms
--          until which this try keeps the waiter in line (after it, its client's alive key does)
-- KEYS[4]  the prefix of the per-client wake-up channels (<prefix><client id>)
-- KEYS[5]  the fencing token counter, shared by every lock name (never expires)
-- KEYS[6]  the prefix of the per-client alive keys of the lock's slot (see _queue.lua)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (<client id>:<task or explicit owner>)
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  the fair wait timeout in milliseconds: how long a silent waiter keeps its place
-- ARGV[5..] optional, as for lock/acquire.lua: 'late:<ids>', releases of this owner its client
--          resent lately, whose late copies the hold must refuse; 'fresh' when the client knows
--          no hold of this owner on this lock; 'once' when the caller will not wait (one
--          attempt: a refusal takes no place); 'first' when the client knows the owner
--          has nothing on the server, in the lock or its queue (the first try of its only
--          call, fresh: see below); 'm:<member>', the owner's place in the queue as its
--          call's last try left it (it is looked for by value, not searched for by owner);
--          't:<ms>', a lower bound of the server's time in ms from the client's sample of its
--          clock, used for the waiter's deadline instead of TIME; and last, set on a resend,
--          the client's resend window in ms, for which the request is then voided
--
-- Returns {fencing token, hold count, PTTL} when granted, else '<ms> <server time ms>': in how
-- many ms the lock may be free with nobody told (the lock's lease, which publishes nothing
-- when it runs out, or the wait timeout), when the client's keep-alive (keep.lua) looks at
-- the lock and hands it over if it is free; a hand-off message comes sooner, and a grant from
-- the queue tells the next in line when its lease ends, see _queue.lua.  Then the server's
-- clock when it queued, which the client relates to its own (the time a grant by message was
-- made is on the server's clock), or '-' when the try used 't:' (it read no clock), and the
-- owner's member of the queue (none for 'once').  A late copy's refusal answers the ms alone.
--
-- A release grants the lock to the head of the queue itself (hand_over in _queue.lua), with
-- the lease and request id its last try stored here, and marks it 'q:<owner>'.  A 'fresh' try of an
-- owner that holds such a grant takes it as its own (its message was lost or late, or the
-- try was in flight when the release granted): one hold, now of this request, the lease at
-- least the one asked for.  Without 'fresh' (the client knows its hold) a try re-enters.
-- A try carrying 'late:' or a resend mark stores lease 0: it is woken, not granted.
--
-- Granted only when the lock is free and the queue is empty or starts with this owner.  A
-- resend never counts a second hold or takes a second place.  Every command is paid per
-- acquisition, so each path reads only what it needs: a 'first' try (the contended
-- acquisition's) reads the lock's PTTL and the meta hash (no re-entry, no grant of its own to
-- adopt) and pushes its member without looking for one; the queue's head only when the lock
-- is free; the clock only when the client vouches for none; vanished waiters are dropped by
-- releases and keep-alives only.
--@include common/_time
--@include common/_requests
--@include common/_hold
--@include fair/_queue
local owner = ARGV[2]
local request = owner .. '/' .. ARGV[3]
local late, resent, fresh, once, first, at, known = optional_args(5)
local lease = tonumber(ARGV[1])
local wait = tonumber(ARGV[4])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
if not wait or wait < 3 or wait > 1e12 then
    return redis.error_reply('ERR aiolock: wait timeout must be 3 to 1e12 milliseconds')
end

-- Take (or keep) the owner's place: pttl, the lock's (-2: free).  look: the owner may have a
-- member already (not a first try), which is then replaced in place, keeping its turn: found
-- by value when the client named it ('m:'), else searched for (O(n): a resend, whose first
-- copy may have replaced the member named, or a call that does not know its place).
local function enqueue(pttl, look)
    local now = at or now_ms()
    -- Parked until a hand-off message names this owner; meanwhile its client's alive key keeps
    -- its place, and its keep-alive looks at the lock when the holder's lease runs out (a
    -- holder that died releases nothing), or after a wait timeout in any case.  PTTL 0: the
    -- lease ends in this very millisecond (the key expires only once the clock is past it).
    local pause = math.max(pttl >= 0 and pttl or wait, 1) .. ' ' .. (at and '-' or now)
    if once then
        return pause  -- a caller that will not wait takes no place (and withdraws nothing)
    end
    -- What a grant from the queue needs (hand_over): lease 0 after a fault (the grant must
    -- carry 'late:' ids, or the request was resent), else at most the wait timeout, so that a
    -- grant to a waiter that vanished blocks the lock no longer than a vanished head does.
    -- Then the deadline.
    local queued = (late or resent) and 0 or math.min(lease, wait)
    local member = queued .. ' ' .. ARGV[3] .. ' ' .. wait .. ' ' .. (now + wait) .. ' ' .. owner
    local mine
    if look and known and not resent then
        mine = redis.call('LPOS', QUEUE, known)
    elseif look then
        mine = select(2, members_of(owner))
    end
    if mine then
        redis.call('LSET', QUEUE, mine, member)
    elseif redis.call('RPUSH', QUEUE, member) == 1 then
        -- A new queue: armed to outlive its last live waiter after a fault, re-armed by the
        -- keep-alives of the clients waiting (keep.lua), not by every try.
        redis.call('PEXPIRE', QUEUE, QUEUE_TTL * wait)
    end
    return pause .. ' ' .. member
end

local function attempt()
    if first and not late and not resent then
        -- The owner has nothing here (its client knows): free and nobody in line, or its place.
        local pttl = redis.call('PTTL', KEYS[1])
        if stale(KEYS[2], owner, request) then
            return math.max(pttl, 1)  -- a late copy of an undone call: its caller is gone
        end
        if pttl == -2 and not redis.call('LINDEX', QUEUE, 0) then
            return grant(KEYS[1], FENCE, owner, request, lease)
        end
        return enqueue(pttl, false)
    end
    -- The whole lock hash in one read (an owner, its token, the last request, undo markers): it
    -- says whether the lock exists and what re-entering needs.
    local fields = redis.call('HGETALL', KEYS[1])
    local locked = #fields > 0
    local map = {}
    for i = 1, #fields, 2 do
        map[fields[i]] = fields[i + 1]
    end
    local held = {map[owner], map['r:' .. owner], map['f:' .. owner], map['x:' .. owner]}
    if locked and fresh and map['q:' .. owner] and held[1] and held[4] ~= request
            and not older(owner, request, held[2]) then
        -- A grant from the queue the client has not taken (see above): adopt it.
        if late then
            redis.call('HSET', KEYS[1], 'r:' .. owner, request, ':late:' .. owner, late)
        else
            redis.call('HSET', KEYS[1], 'r:' .. owner, request)
        end
        redis.call('HDEL', KEYS[1], 'q:' .. owner)
        local pttl = redis.call('PTTL', KEYS[1])
        if pttl < lease then
            redis.call('PEXPIRE', KEYS[1], lease)
            pttl = lease
        end
        return {tonumber(held[3]), tonumber(held[1]), pttl}
    end
    if locked then
        local again = reenter_read(KEYS[1], held, owner, request, lease, nil, late)
        if again then
            return again
        elseif again == false or stale(KEYS[2], owner, request) then
            -- A late copy of an undone or voided call: its caller is gone (it queues nothing).
            return math.max(redis.call('PTTL', KEYS[1]), 1)
        end
        return enqueue(redis.call('PTTL', KEYS[1]), true)
    elseif stale(KEYS[2], owner, request) then
        return 1  -- a late copy of an undone or answered call: its caller is gone (no queuing)
    end
    local head = redis.call('LINDEX', QUEUE, 0)
    if not head then
        return grant(KEYS[1], FENCE, owner, request, lease, late)
    elseif owner_of(head) == owner then
        redis.call('LPOP', QUEUE)
        local reply = grant(KEYS[1], FENCE, owner, request, lease, late)
        bound_next(lease, wait)
        return reply
    end
    -- Free, and another waiter is first: its hand-off message is on the way (or, if it
    -- vanished, the keep-alive of a client still waiting drops it and wakes the next).
    return enqueue(-2, true)
end

local reply = attempt()
if resent then  -- a resend: its first copy may still arrive
    void_request(KEYS[2], request, resend_ms(resent))
end
return reply
