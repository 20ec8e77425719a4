-- Acquire or re-enter a reentrant lock.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, ':fence' -> token, ':req' -> last request
-- KEYS[2]  the meta hash: 'next' -> fencing token counter (never expires)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (client UUID + task or explicit token)
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
--
-- Returns {fencing token, hold count, PTTL} when granted, else the lock's PTTL (an integer;
-- -1 if it has no expiry).
--
-- A resend of an already applied request (redis-py retries a call whose reply timed out)
-- returns the grant again without counting a second hold.  Re-entering never shortens the
-- lease that is already set.
local request = ARGV[2] .. '/' .. ARGV[3]
local lease = tonumber(ARGV[1])
-- Checked before any write: a PEXPIRE that fails after HSET would leave a lock that never expires.
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end

if redis.call('EXISTS', KEYS[1]) == 0 then
    local token = redis.call('HINCRBY', KEYS[2], 'next', 1)
    redis.call('HSET', KEYS[1], ARGV[2], 1, ':fence', token, ':req', request)
    redis.call('PEXPIRE', KEYS[1], lease)
    return {token, 1, lease}
end

local held = redis.call('HMGET', KEYS[1], ARGV[2], ':req', ':fence')
if not held[1] then
    return redis.call('PTTL', KEYS[1])
end

local count = tonumber(held[1])
if held[2] ~= request then
    count = count + 1
    redis.call('HSET', KEYS[1], ARGV[2], count, ':req', request)
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
    pttl = lease
end
return {tonumber(held[3]), count, pttl}
