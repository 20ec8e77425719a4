-- A waiter gives up (timeout, cancellation): it withdraws from the fair lock's queue at once.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue (see _queue.lua)
-- KEYS[4]  the prefix of the per-client wake-up channels
-- KEYS[5]  the fencing token counter (a grant from the queue takes a token)
-- KEYS[6]  the prefix of the per-client alive keys of the lock's slot (see _queue.lua)
-- ARGV[1]  owner id
-- ARGV[2]  optional: 'fresh' when the client knows no hold of the owner on this lock
--
-- Returns 1 if the owner was queued, or held a grant from the queue its client never took,
-- else 0.  If it was next and the lock is free, the lock is handed over to the waiter after it.
-- With 'fresh', a grant from the queue to this owner that its client never took ('q:<owner>'
-- in the lock hash: its message came after the waiter gave up, or was lost) is taken back:
-- the lock is deleted and handed over, as a release would.  Idempotent: withdrawing twice
-- changes nothing.  It looks through the whole queue (O(n)): only a waiter that gives up pays.
--@include common/_time
--@include fair/_queue
local owner = ARGV[1]
if ARGV[2] == 'fresh' then
    local held = redis.call('HMGET', KEYS[1], owner, 'q:' .. owner)
    if held[1] and held[2] then
        redis.call('DEL', KEYS[1])
        hand_over(now_ms())
        return 1
    end
end
local mine, first = members_of(owner)
for _, member in ipairs(mine) do
    redis.call('LREM', QUEUE, 0, member)
end
if first == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
    hand_over(now_ms())
end
return #mine > 0 and 1 or 0
