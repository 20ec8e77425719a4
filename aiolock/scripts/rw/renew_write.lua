-- Renew many write holds of read-write locks in one call (the watchdog's batch).
--
-- KEYS[2i-1], KEYS[2i]  the lock hash and readers set of the i-th hold
-- ARGV[1]    lease in milliseconds
-- ARGV[i+1]  the owner id of the i-th hold
--
-- Returns one entry per hold: 1 when renewed, 0 when the owner no longer holds it (write).
--@include common/_time
--@include common/_requests
--@include rw/_rw
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
return renew('w', lease)
