-- Count a countdown latch down by one; at zero it is deleted and every waiter woken.
--
-- KEYS[1]  the latch's count (absent means zero)
-- KEYS[2]  the latch's channel (declared as a key so Cluster routes it with the count)
--
-- Returns the count left (0 when it reached zero now or was already zero).
if redis.call('EXISTS', KEYS[1]) == 0 then
    return 0
end
local left = redis.call('DECR', KEYS[1])
if left <= 0 then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2], 'zero')
    return 0
end
return left
