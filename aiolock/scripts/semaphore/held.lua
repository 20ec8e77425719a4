-- How many permits of a semaphore are held now.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms)
--
-- Returns the number of permits whose lease has not ended (dropping those that have).
--@include common/_time
--@include semaphore/_permits
drop_expired()
return redis.call('ZCARD', KEYS[1])
