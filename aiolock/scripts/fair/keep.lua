-- Keep the places of one client's waiters in a fair lock's queue: one call for all of them.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue: owner -> ticket
-- KEYS[4]  the waiters: owner -> '<lease ms> <request n> <wait ms> <deadline>' (see
--          acquire.lua)
-- KEYS[5]  the prefix of the per-client wake-up channels
-- KEYS[6]  the fencing token counter (a grant from the queue takes a token)
-- ARGV[1]  the fair wait timeout in milliseconds
-- ARGV[2..] the owners of this client waiting for the lock
--
-- Returns {the owners among them that are not in the queue (dropped, or not queued yet: they
-- must try again to take a place), ms until the next call is due if sooner than a third of
-- the wait timeout: the head's deadline or the end of the lease held (0: none)}.
--
-- Each client runs it every third of the wait timeout while it has waiters, instead of each
-- waiter re-trying: it moves their deadlines on, keeps the queue's keys alive, and, while the
-- lock is free (its lease ran out, which publishes nothing, or the head was only woken),
-- drops vanished waiters at the head and hands the lock over to the first live one (see
-- hand_over in _queue.lua).  A free lock whose head is still within its deadline: the client calls again when
-- it runs out, so a vanished head delays the queue by at most the wait timeout.
--@include common/_time
--@include fair/_queue
local wait = tonumber(ARGV[1])
if not wait or wait < 3 or wait > 1e12 then
    return redis.error_reply('ERR aiolock: wait timeout must be 3 to 1e12 milliseconds')
end
local now = now_ms()
local deadline = now + wait
local missing = {}
-- In chunks: unpack() is bounded by Lua's stack.
for from = 2, #ARGV, 500 do
    local to = math.min(from + 499, #ARGV)
    local owners = {}
    for i = from, to do
        owners[#owners + 1] = ARGV[i]
    end
    local entries = redis.call('HMGET', KEYS[4], unpack(owners))
    local moved = {}
    for i, entry in ipairs(entries) do
        local ms, n, owner_wait = waiter_args(entry)
        if ms then
            moved[#moved + 1] = owners[i]
            moved[#moved + 1] = ms .. ' ' .. n .. ' ' .. owner_wait .. ' ' .. deadline
        else
            missing[#missing + 1] = owners[i]
        end
    end
    if #moved > 0 then
        redis.call('HSET', KEYS[4], unpack(moved))
    end
end
local pttl = redis.call('PTTL', KEYS[4])
if pttl ~= -2 and pttl < wait then
    redis.call('PEXPIRE', KEYS[3], 2 * wait)
    redis.call('PEXPIRE', KEYS[4], 2 * wait)
end
local due = 0
local held = redis.call('PTTL', KEYS[1])
if held == -2 then
    local head, head_deadline = live_head(now)
    if head then
        hand_over(now, head)
        held = redis.call('PTTL', KEYS[1])
        if held == -2 then  -- only woken: the next call comes at its deadline (it may vanish)
            due = math.max(head_deadline - now + 1, 1)
        end
    end
end
if held > 0 then
    -- A lease that runs out publishes nothing, and these waiters may be parked past it (until
    -- the end of a longer hold released early, or of a grant to a waiter that vanished): the
    -- next call comes when it runs out, and hands over then.
    due = held + 1
end
return {missing, due}
