-- Acquire or re-enter a fair lock, or take (and keep) a place in its queue.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, ':fence' -> token, ':req' -> last request
-- KEYS[2]  the meta hash: 'undone' -> an acquire undone before it arrived (see common/_requests.lua)
-- KEYS[3]  the queue: owner -> ticket (sorted set)
-- KEYS[4]  the queue deadlines: owner -> server time in ms after which it is dropped
-- KEYS[5]  the prefix of the per-client wake-up channels (<prefix><client id>)
-- KEYS[6]  the fencing token counter, shared by every lock name (never expires)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (<client id>:<task or explicit owner>)
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  the fair wait timeout in milliseconds: how long a silent waiter keeps its place
--
-- Returns {fencing token, hold count, PTTL} when granted, else how many ms to wait before the
-- next try (the waiter must try again within a third of the wait timeout to keep its place).
--
-- Granted only when the lock is free and the queue is empty or starts with this owner.  A
-- resend never counts a second hold or takes a second place.
--@include common/_time
--@include common/_requests
--@include common/_hold
--@include fair/_queue
local owner = ARGV[2]
local request = owner .. '/' .. ARGV[3]
local lease = tonumber(ARGV[1])
local wait = tonumber(ARGV[4])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
if not wait or wait < 3 or wait > 1e12 then
    return redis.error_reply('ERR aiolock: wait timeout must be 3 to 1e12 milliseconds')
end

local now = now_ms()
local dropped = drop_vanished(now)
local first = head()

if redis.call('EXISTS', KEYS[1]) == 1 then
    local again = reenter(KEYS[1], owner, request, lease)
    if again then
        return again
    elseif again == false then
        return math.max(redis.call('PTTL', KEYS[1]), 1)  -- a late copy of an undone call
    end
elseif undone(KEYS[2], request) then
    return 1  -- a late copy of an undone call: its caller is gone (and it queues nothing)
elseif not first or first == owner then
    redis.call('ZREM', KEYS[3], owner)
    redis.call('ZREM', KEYS[4], owner)
    return grant(KEYS[1], KEYS[6], owner, request, lease)
elseif dropped > 0 then
    wake_next(now)  -- free, and the waiters ahead of the new head vanished: it is its turn
end

if not redis.call('ZSCORE', KEYS[3], owner) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    local ticket = last[2] and tonumber(last[2]) + 1 or 1
    redis.call('ZADD', KEYS[3], ticket, owner)
end
redis.call('ZADD', KEYS[4], now + wait, owner)
-- The queue's keys outlive their last live waiter by one to two wait timeouts: re-armed
-- once per wait timeout, not on every try.
for i = 3, 4 do
    if redis.call('PTTL', KEYS[i]) < wait then
        redis.call('PEXPIRE', KEYS[i], 2 * wait)
    end
end

local pause = math.floor(wait / 3)
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
    pause = math.min(pause, pttl)
elseif first and first ~= owner then
    -- Free, and the head has not taken it yet: if the head vanished, try once it is dropped.
    local due = tonumber(redis.call('ZSCORE', KEYS[4], first)) - now + 1
    pause = math.min(pause, due)
end
return math.max(pause, 1)
