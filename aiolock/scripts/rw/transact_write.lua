-- Run a transaction's queued commands only while the owner holds the write hold of a
-- read-write lock with the guard's fencing token.
--
-- KEYS[1]  the lock hash: 'w' -> the writer, 'we' -> its lease end (server ms), ':fence' ->
--          the write hold's token (see rw/_rw.lua)
-- KEYS[2..] the keys the queued commands touch (declared for Cluster routing)
-- ARGV[1]  owner id
-- ARGV[2]  the guard's fencing token
-- ARGV[3..] the queued commands (see common/_queued.lua)
--
-- Returns {1, replies} when the hold was there and the commands ran, else {0}: none ran.
-- The write lease ends on the server's clock, dropped lazily by the next call that looks: an
-- end already past counts as no hold.
--@include common/_time
--@include common/_queued
local held = redis.call('HMGET', KEYS[1], 'w', 'we', ':fence')
local ends = tonumber(held[2])
if held[1] ~= ARGV[1] or held[3] ~= ARGV[2] or not ends or ends <= now_ms() then
    return {0}
end
return {1, run_queued(3)}
