-- Run a transaction's queued commands only while the owner holds a reentrant lock (the plain,
-- spin and fair locks: their lock hash is the same) with the guard's fencing token.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, 'f:<owner>' -> that hold's token
-- KEYS[2..] the keys the queued commands touch (declared for Cluster routing)
-- ARGV[1]  owner id
-- ARGV[2]  the guard's fencing token
-- ARGV[3..] the queued commands (see common/_queued.lua)
--
-- Returns {1, replies} when the hold was there and the commands ran, else {0}: none ran.
-- The hold is the owner's field in the hash (the hash expires with the lease), and the token
-- tells this hold from a later one of the same owner (the lease ran out and it acquired again).
--@include common/_queued
local held = redis.call('HMGET', KEYS[1], ARGV[1], 'f:' .. ARGV[1])
if not held[1] or held[2] ~= ARGV[2] then
    return {0}
end
return {1, run_queued(3)}
