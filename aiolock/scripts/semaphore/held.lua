-- How many permits of a semaphore are held now, and its count.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms), and the count (see _permits)
--
-- Returns {held, count}: the permits whose lease has not ended (dropping those that have), and
-- the count kept with them (0 when none is kept: nobody holds a permit).
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
drop_expired()
local taken = held()
local kept = taken > 0 and count_of(redis.call('ZSCORE', KEYS[1], COUNT)) or 0
return {taken, kept}
