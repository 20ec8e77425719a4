-- Read a read-write lock's state (changes nothing but dropping what expired).
--
-- KEYS[1..7]  the lock, meta, readers, waiting writers, readers' and writers' channels,
--              the fencing counter
-- ARGV[1]     an owner id
--
-- Returns {writer or false, live readers, the owner's read holds, the owner's write holds,
-- ms until the write hold ends (0: none), ms until the last read hold ends (0: none)}.
--@include common/_time
--@include common/_requests
--@include rw/_rw
local now = now_ms()
expire(now)
local held = redis.call('HMGET', KEYS[1], 'w', 'wc', 'r:' .. ARGV[1])
local writes = held[1] == ARGV[1] and tonumber(held[2]) or 0
return {held[1] or false, live_readers(now), tonumber(held[3]) or 0, writes, write_left(now),
    read_left(now)}
