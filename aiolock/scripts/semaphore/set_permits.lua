-- Change a semaphore's count for every caller (sem.set_permits(n)), and wake waiters if it grew.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms), and the count (see _permits)
-- KEYS[2]  the semaphore's channel
-- ARGV[1]  the new count (an integer >= 1)
--
-- Returns the count it replaced, 0 when none was kept: nobody holds a permit, so the count
-- lives nowhere and the next acquirer's sets it (a count that permits past their lease left
-- behind is dropped then).  Holders above a lower count keep their permits; nobody new is
-- admitted until fewer are held (acquire.lua compares with it).  A higher count publishes one
-- message per permit it frees (each wakes one waiter of every client), at most WAKE_AT_MOST:
-- waiters past those try again when the earliest permit's lease ends, as they would anyway.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local WAKE_AT_MOST = 1000
local count = tonumber(ARGV[1])
if not count or count < 1 or count ~= math.floor(count) then
    return redis.error_reply('ERR aiolock: the count must be an integer of 1 or more')
end
drop_expired()
local taken = held()
if taken == 0 then
    redis.call('ZREM', KEYS[1], COUNT)
    return 0
end
local kept = count_of(redis.call('ZSCORE', KEYS[1], COUNT)) or count
redis.call('ZADD', KEYS[1], COUNT_BASE - count, COUNT)
local freed = math.min(count - math.max(kept, taken), WAKE_AT_MOST)
for _ = 1, freed do
    redis.call('PUBLISH', KEYS[2], 'released')
end
return kept
