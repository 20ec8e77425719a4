-- Run a transaction's queued commands only while a semaphore's permit is held.
--
-- KEYS[1]  the permits: permit id -> lease end (server ms); see semaphore/_permits.lua
-- KEYS[2..] the keys the queued commands touch (declared for Cluster routing)
-- ARGV[1]  the permit id (unique per acquisition: it plays the fencing token's part)
-- ARGV[2]  unused (permits carry no fencing token; the id tells one from another)
-- ARGV[3..] the queued commands (see common/_queued.lua)
--
-- Returns {1, replies} when the permit was held and the commands ran, else {0}: none ran.
-- A permit past its lease end is not held, whether or not it was dropped yet.
--@include common/_time
--@include common/_queued
local ends = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not ends or ends <= now_ms() then
    return {0}
end
return {1, run_queued(3)}
