-- Renew the leases of many permits in one call (the watchdog's batch).
--
-- KEYS[i]    the permits set of a semaphore
-- ARGV[1]    lease in milliseconds
-- ARGV[i+1]  the permit id held in KEYS[i]
--
-- Returns one entry per key: 1 when renewed, 0 when the permit is no longer held (its lease
-- ended, or it was released).  A longer lease already set is kept.
--@include common/_time
--@include common/_requests
--@include semaphore/_permits
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local now = now_ms()
local renewed = {}
for i, key in ipairs(KEYS) do
    local ends = tonumber(redis.call('ZSCORE', key, ARGV[i + 1]))
    if ends and ends > now then
        if ends < now + lease then
            redis.call('ZADD', key, now + lease, ARGV[i + 1])
        end
        keep(key, lease)
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
