-- Acquire or re-enter a reentrant lock.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, 'f:<owner>' -> token, 'r:<owner>' -> its last
--          request (see common/_hold.lua)
-- KEYS[2]  the meta hash: '<owner>/<n>' -> an acquire undone before it arrived or voided
--          (see common/_requests.lua); it exists only for a resend window after a fault
-- KEYS[3]  the fencing token counter, shared by every lock name (never expires)
-- KEYS[4]  optional: the lock's waiting owners (a sorted set, see lock/_waiting.lua); given
--          when a refused caller parks on the lock's channel (the spin lock's never do)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (client UUID + task or explicit token)
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  '0' if a refused caller does not park; else '[!~]<order> <ms> <member>': a refusal
--          enters the member ('<lease ms> <n> <client> <owner>') in the waiting set (at
--          <order>, the set kept at least <ms>) and marks this incarnation of the lock as
--          waited for (':w'), so that its last release grants it to the first member; '!'
--          marks a grant so too (other calls of its client wait: the set may name more
--          owners), and '~' marks it and takes the member out of the set (the owner entered
--          before); a grant from the set to this member that its client did not take yet
--          ('q:<owner>' = the member's n) is taken by this try, as its one hold
-- ARGV[5..] optional, neither there on the fault-free path: 'late:<ids>', the request ids of
--          releases of this owner that its client resent lately (comma-separated; the hold
--          this call makes or re-enters keeps them as ':late:<owner>', and their late copies
--          change nothing: common/_hold's release_one); and last, set on a resend, the
--          client's resend window in ms, for which the request is then voided (common/_requests)
--
-- Returns, granted: the fencing token alone (an integer) for a fresh hold on the fault-free
-- path (count 1, the lease asked), else {fencing token, hold count, PTTL}; refused: {the
-- lock's PTTL} (-1 if it has no expiry; 1 for a late copy refused on a free lock).  The
-- integer spares the server a table on every fault-free grant (measured, benchmarks/README).
--
-- A resend of an already applied request (redis-py retries a call whose reply timed out)
-- returns the grant again without counting a second hold.  Re-entering never shortens the
-- lease that is already set.
--
-- Commands, as few as each path allows: a fresh grant with no marker around (the fault-free
-- case) EXISTS of the lock and the meta hash at once, INCR, HSET, PEXPIRE; a fresh grant
-- after a recent fault adds PTTL of the lock and HMGET of the meta hash; a refusal EXISTS,
-- PTTL (its reply), HMGET, ZADD and PEXPIRE of the waiting set, and HSET of ':w' for the
-- first waiter refused; a re-entry EXISTS, PTTL, HMGET, HSET, and PEXPIRE only to lengthen;
-- taking a grant from the set EXISTS, PTTL, HMGET, HSET, HDEL.
local lease = tonumber(ARGV[1])
-- Checked before any write: a PEXPIRE that fails after HSET would leave a lock that never
-- expires.  Digits only, so that the fast path below can pass ARGV[1] on as it came.
if not lease or lease < 1 or lease > 1e12 or not string.find(ARGV[1], '^[1-9]%d*$') then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end

-- The fault-free fresh grant comes first, before the helpers below: a script runs from its
-- top on every call, and defining them costs the server more than this whole path.  One
-- command tells it: the lock is free and no marker of a recent fault exists (a late copy can
-- exist only after a fault, which writes one: common/_requests).  A call with optional ARGV
-- (a fault path) takes the general path.
-- A refused caller that parks enters its owner in the waiting set, which the last release
-- of the lock reads to grant it to the first member (lock/_waiting.lua).
local function parse_entry()
    return string.match(ARGV[4] or '', '^([!~]?)(%d+) (%d+) ((%d+) (%d+) .+)$')
end

local function wait_behind(pttl, marked)
    local _, order, ms, member = parse_entry()
    if not member then
        return
    end
    redis.call('ZADD', KEYS[4], 'NX', order, member)
    -- The set outlives the waiters it names: they park until this lease ends at the latest.
    redis.call('PEXPIRE', KEYS[4], math.max(tonumber(ms), pttl + 2000))
    if not marked then
        redis.call('HSET', KEYS[1], ':w', '1')  -- the release that deletes it grants the next
    end
end

-- A grant from the set to this try's member that its client has not taken: this try takes
-- it, as the owner's one hold (its request is now the hold's last), with the lease it asks
-- for if that is longer (a grant's lease is capped).  held: the owner's fields as HMGET read
-- them (count, 'r:', 'f:', 'x:', ':w', 'q:').
local function take_granted(held, pttl)
    local _, _, _, _, _, n = parse_entry()
    if held[1] ~= '1' or not n or held[6] ~= n then
        return nil
    end
    redis.call('HSET', KEYS[1], 'r:' .. ARGV[2], ARGV[2] .. '/' .. ARGV[3])
    redis.call('HDEL', KEYS[1], 'q:' .. ARGV[2])
    if pttl < lease then
        redis.call('PEXPIRE', KEYS[1], lease)
        pttl = lease
    end
    return {tonumber(held[3]), 1, pttl}
end

local present, pttl, held
if #ARGV == 4 then
    present = redis.call('EXISTS', KEYS[1], KEYS[2])
    if present == 0 then
        local token = redis.call('INCR', KEYS[3])
        local owner = ARGV[2]
        -- Strings where a number would do: a Lua number passed to redis.call is formatted
        -- with snprintf on Redis 7.0, a cost on every acquisition (benchmarks/README).
        local mark = string.byte(ARGV[4])
        if mark == 33 or mark == 126 then  -- '!' or '~': its release hands the lock over
            redis.call('HSET', KEYS[1], owner, '1', 'f:' .. owner, token, 'r:' .. owner,
                owner .. '/' .. ARGV[3], ':w', '1')
            if mark == 126 then
                redis.call('ZREM', KEYS[4], string.match(ARGV[4], '^~%d+ %d+ (.+)$'))
            end
        else
            redis.call('HSET', KEYS[1], owner, '1', 'f:' .. owner, token, 'r:' .. owner,
                owner .. '/' .. ARGV[3])
        end
        redis.call('PEXPIRE', KEYS[1], ARGV[1])
        return token
    end
    -- The fault-free refusal too (a waiter's first try): the lock lives, and this owner has no
    -- hold in it (a marker of a fault matters only on a free lock, or to its own holder).
    pttl = redis.call('PTTL', KEYS[1])
    if pttl ~= -2 then
        local owner = ARGV[2]
        held = redis.call('HMGET', KEYS[1], owner, 'r:' .. owner, 'f:' .. owner, 'x:' .. owner,
            ':w', 'q:' .. owner)
        if not held[1] then
            wait_behind(pttl, held[5])
            return {pttl}
        end
    end
end

--@include common/_time
--@include common/_requests
--@include common/_hold
local request = ARGV[2] .. '/' .. ARGV[3]
local late, resent = optional_args(5)

-- A fresh grant marked '!' or '~' (see ARGV[4]) is marked waited for, as on the fast path.
local function granted(reply)
    local mark = string.byte(ARGV[4] or '')
    if mark == 33 or mark == 126 then
        redis.call('HSET', KEYS[1], ':w', '1')
        if mark == 126 then
            redis.call('ZREM', KEYS[4], string.match(ARGV[4], '^~%d+ %d+ (.+)$'))
        end
    end
    return reply
end

local function attempt()
    local owner = ARGV[2]
    -- present, pttl and held: read above already on a call with no optional ARGV.
    if (present or redis.call('EXISTS', KEYS[1], KEYS[2])) == 0 then
        return granted(grant(KEYS[1], KEYS[3], owner, request, lease, late))
    end
    pttl = pttl or redis.call('PTTL', KEYS[1])
    if pttl == -2 then  -- free: only markers of a recent fault exist
        if stale(KEYS[2], owner, request) then
            return {1}  -- a late copy of an undone or answered call: its caller is gone
        end
        return granted(grant(KEYS[1], KEYS[3], owner, request, lease, late))
    end
    held = held or redis.call('HMGET', KEYS[1], owner, 'r:' .. owner, 'f:' .. owner, 'x:' .. owner,
        ':w', 'q:' .. owner)
    local taken = held[6] and take_granted(held, pttl)
    if taken then
        return taken
    end
    local again = reenter_read(KEYS[1], held, owner, request, lease, pttl, late)
    if again then
        return again
    end
    if again == nil then
        wait_behind(pttl, held[5])
    end
    return {pttl}  -- held by another owner, or a late copy of an undone call
end

local reply = attempt()
if resent then  -- a resend: its first copy may still arrive
    void_request(KEYS[2], request, resend_ms(resent))
end
return reply
