-- How many permits of a semaphore are held now.
--
-- KEYS[1]  the permits: permit id -> lease end (server time, ms) (see _permits)
--
-- Returns the number of permits whose lease has not ended (dropping those that have).
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
drop_expired()
return held()
