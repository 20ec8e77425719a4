-- Acquire or re-enter a reentrant lock.
--
-- KEYS[1]  the lock hash: <owner> -> hold count, ':fence' -> token, ':req' -> last request
-- KEYS[2]  the meta hash: 'released' -> the request that last deleted the lock, '<owner>/<n>'
--          -> an acquire undone before it arrived or fenced off (see common/_requests.lua)
-- KEYS[3]  the fencing token counter, shared by every lock name (never expires)
-- ARGV[1]  lease in milliseconds
-- ARGV[2]  owner id (client UUID + task or explicit token)
-- ARGV[3]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[4]  optional: set on a resend, whose request is then fenced off (common/_requests)
--
-- Returns {fencing token, hold count, PTTL} when granted, else the lock's PTTL (an integer;
-- -1 if it has no expiry).
--
-- A resend of an already applied request (redis-py retries a call whose reply timed out)
-- returns the grant again without counting a second hold.  Re-entering never shortens the
-- lease that is already set.
--@include common/_time
--@include common/_requests
--@include common/_hold
local request = ARGV[2] .. '/' .. ARGV[3]
local lease = tonumber(ARGV[1])
-- Checked before any write: a PEXPIRE that fails after HSET would leave a lock that never expires.
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end

local function attempt()
    if redis.call('EXISTS', KEYS[1]) == 0 then
        if stale(KEYS[2], ARGV[2], request) then
            return 1  -- a late copy of an undone or answered call: its caller is gone
        end
        return grant(KEYS[1], KEYS[3], ARGV[2], request, lease)
    end
    local again = reenter(KEYS[1], ARGV[2], request, lease)
    if again then
        return again
    end
    return redis.call('PTTL', KEYS[1])  -- held by another owner, or a late copy of an undone call
end

local reply = attempt()
if ARGV[4] then  -- a resend: its first copy may still arrive
    fence_off(KEYS[2], request)
end
return reply
