-- Renew the leases of many held locks in one call (the watchdog's batch).
--
-- KEYS[i]    a lock hash
-- ARGV[1]    lease in milliseconds
-- ARGV[i+1]  the owner id that holds KEYS[i]
--
-- Returns a list with one entry per key: 1 when renewed, 0 when the owner no longer holds it
-- (expired, force-unlocked, or taken by another owner: a stale renewal never extends
-- somebody else's lease).  A longer lease that is already set is kept.
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local renewed = {}
for i, key in ipairs(KEYS) do
    if redis.call('HEXISTS', key, ARGV[i + 1]) == 1 then
        if redis.call('PTTL', key) < lease then
            redis.call('PEXPIRE', key, lease)
        end
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
