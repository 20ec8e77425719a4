-- Run a transaction's queued commands only while the owner holds a read hold of a read-write
-- lock with the guard's fencing token.
--
-- KEYS[1]  the lock hash: 't:<owner>' -> the owner's read token (see rw/_rw.lua)
-- KEYS[2]  the readers: owner -> its read lease end (server ms)
-- KEYS[3..] the keys the queued commands touch (declared for Cluster routing)
-- ARGV[1]  owner id
-- ARGV[2]  the guard's fencing token
-- ARGV[3..] the queued commands (see common/_queued.lua)
--
-- Returns {1, replies} when the hold was there and the commands ran, else {0}: none ran.
-- Read leases end on the server's clock, dropped lazily by the next call that looks: a lease
-- end already past counts as no hold, whether or not it was dropped yet.
--@include common/_time
--@include common/_queued
local token = redis.call('HGET', KEYS[1], 't:' .. ARGV[1])
local ends = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
if token ~= ARGV[2] or not ends or ends <= now_ms() then
    return {0}
end
return {1, run_queued(3)}
