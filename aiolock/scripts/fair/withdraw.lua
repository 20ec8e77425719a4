-- A waiter gives up (timeout, cancellation): it withdraws from the fair lock's queue at once.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash (unused here: every fair script takes the same keys)
-- KEYS[3]  the queue (see _queue.lua)
-- KEYS[4]  the prefix of the per-client wake-up channels
-- KEYS[5]  the fencing token counter (a grant from the queue takes a token)
-- KEYS[6]  the prefix of the per-client alive keys of the lock's slot (see _queue.lua)
-- ARGV[1]  owner id
-- ARGV[2..] optional: 'fresh' when the client knows no hold of the owner on this lock;
--          'm:<member>', the owner's place in the queue as its last try left it
--
-- Returns 1 if the owner was queued, or held a grant from the queue its client never took,
-- else 0.  If it was next and the lock is free, the lock is handed over to the waiter after it.
-- With 'fresh', a grant from the queue to this owner that its client never took ('q:<owner>'
-- in the lock hash: its message came after the waiter gave up, or was lost) is taken back:
-- the lock is deleted and handed over, as a release would.  Idempotent: withdrawing twice
-- changes nothing.  The member named is removed by value (LREM, from the head: waiters that
-- time out together are near it); without one, or if it is not there (the server dropped
-- it, or a try the client never heard of replaced it), every member of the owner is searched
-- for (O(n)).
--@include common/_time
--@include fair/_queue
local owner, fresh, known = ARGV[1], false, nil
for i = 2, #ARGV do
    if ARGV[i] == 'fresh' then
        fresh = true
    elseif string.sub(ARGV[i], 1, 2) == 'm:' then
        known = string.sub(ARGV[i], 3)
    end
end
if fresh then
    local held = redis.call('HMGET', KEYS[1], owner, 'q:' .. owner)
    if held[1] and held[2] then
        redis.call('DEL', KEYS[1])
        hand_over(now_ms())
        return 1
    end
end
local removed, was_next = 0, false
if known then
    was_next = redis.call('LINDEX', QUEUE, 0) == known
    removed = redis.call('LREM', QUEUE, 1, known)
end
if removed == 0 then
    local mine, first = members_of(owner)
    for _, member in ipairs(mine) do
        redis.call('LREM', QUEUE, 0, member)
    end
    removed, was_next = #mine, first == 0
end
if was_next and redis.call('EXISTS', KEYS[1]) == 0 then
    hand_over(now_ms())
end
return removed > 0 and 1 or 0
