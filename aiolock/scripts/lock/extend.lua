-- Set the lease of a held reentrant lock (the plain, spin and fair locks: their lock hash is
-- the same) to a new length from now, whatever the owner's hold count: guard.extend(lease).
--
-- KEYS[1]  the lock hash: <owner> -> hold count, 'f:<owner>' -> that hold's fencing token
-- ARGV[1]  the new lease in milliseconds, from now (longer or shorter than the one it replaces)
-- ARGV[2]  owner id
-- ARGV[3]  the guard's fencing token
--
-- Returns 1 when the lease was set, 0 when the owner no longer holds the lock with that token
-- (its lease ran out, it was forced or released, or this is a later hold of the same owner):
-- nothing changes then.  The hash lives exactly as long as the lease: it is the whole lock's.
local lease = tonumber(ARGV[1])
if not lease or lease < 1 or lease > 1e12 then
    return redis.error_reply('ERR aiolock: lease must be 1 to 1e12 milliseconds')
end
local held = redis.call('HMGET', KEYS[1], ARGV[2], 'f:' .. ARGV[2])
if not held[1] or held[2] ~= ARGV[3] then
    return 0
end
redis.call('PEXPIRE', KEYS[1], lease)
return 1
