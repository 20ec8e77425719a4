-- Keep one client's waiters in the queues of the fair locks of one Cluster slot (one server):
-- one call for all of them.
--
-- KEYS[1]  the prefix of the per-client alive keys of the slot (see _queue.lua)
-- KEYS[2]  the fencing token counter of the slot (a grant from the queue takes a token)
-- KEYS[3i], KEYS[3i+1], KEYS[3i+2]  lock i's hash, queue and wake-up channel prefix (see
--          acquire.lua), for i = 1, 2, ...
-- ARGV[1]  the fair wait timeout in milliseconds
-- ARGV[2]  the client id
-- ARGV[3]  '1' when the client's alive key should exist (it set it, and has not deleted it)
-- ARGV[4]  'gone' when the client has no waiter left in the slot: its alive key is deleted,
--          and nothing else is done; else '-'
-- then, for each lock i in turn: the number m of owners that follow, or -1, and m owners of
--          this client waiting for it
--
-- Returns {1 if the alive key was gone though it should exist (the client stalled: its
-- waiters may have been dropped, and must try again), {for each lock: ms until its next look
-- is due, if the lock is held or its head only woken (0: no such bound)}, {for each lock: the
-- owners sent that are not in its queue (dropped, or not queued yet: they must try again)}}.
--
-- The alive key (set for the wait timeout; the client calls every half of it while it has
-- waiters in the slot) keeps every waiter of the client live: a parked waiter costs nothing
-- here.  Per lock the call looks at the lock: while it is free (its lease ran out, which
-- publishes nothing, or its head was only woken), it drops vanished waiters at the head and
-- hands the lock over to the first live one (see hand_over in _queue.lua).  With an owners
-- count (m >= 0; the client sends one every other wait timeout or so) it also re-arms the
-- queue's expiry and reports the owners it does not have (reading the whole queue: O(n), once
-- every other wait timeout or so).
--@include common/_time
--@include fair/_queue
local wait = tonumber(ARGV[1])
if not wait or wait < 3 or wait > 1e12 then
    return redis.error_reply('ERR aiolock: wait timeout must be 3 to 1e12 milliseconds')
end
local alive = KEYS[1] .. ARGV[2]
if ARGV[4] == 'gone' then
    redis.call('DEL', alive)
    return {0, {}, {}}
end
local lapsed = not redis.call('SET', alive, 1, 'PX', wait, 'GET') and ARGV[3] == '1'
ALIVE, FENCE = KEYS[1], KEYS[2]
local now
local dues, missing = {}, {}
local arg = 5
for i = 3, #KEYS, 3 do
    LOCK, QUEUE, WAKE = KEYS[i], KEYS[i + 1], KEYS[i + 2]
    local m = tonumber(ARGV[arg])
    local lost = {}
    if m >= 0 then
        local present = {}
        for _, member in ipairs(redis.call('LRANGE', QUEUE, 0, -1)) do
            local owner = owner_of(member)
            if owner then
                present[owner] = true
            end
        end
        for j = arg + 1, arg + m do
            if not present[ARGV[j]] then
                lost[#lost + 1] = ARGV[j]
            end
        end
        local pttl = redis.call('PTTL', QUEUE)
        if pttl ~= -2 and pttl < QUEUE_REARM * wait then
            redis.call('PEXPIRE', QUEUE, QUEUE_TTL * wait)
        end
        arg = arg + m + 1
    else
        arg = arg + 1
    end
    local due = 0
    local held = redis.call('PTTL', LOCK)
    if held == -2 then
        now = now or now_ms()
        local live_until = hand_over(now)
        if live_until then  -- only woken: look again when it may have vanished
            due = math.max(live_until - now + 1, 1)
        end
        held = redis.call('PTTL', LOCK)
    end
    if held >= 0 then
        -- A lease that runs out publishes nothing: look again then, and hand over.  PTTL 0:
        -- it ends in this very millisecond (the key expires only once the clock is past it).
        due = held + 1
    end
    dues[#dues + 1] = due
    missing[#missing + 1] = lost
end
return {lapsed and 1 or 0, dues, missing}
