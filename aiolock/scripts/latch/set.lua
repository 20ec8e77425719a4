-- Set a countdown latch's count, unless a count is already set.
--
-- KEYS[1]  the latch's count (a string key; absent means zero)
-- ARGV[1]  the count, at least 1
--
-- Returns 1 if the count was set, 0 if the latch already had a count above zero.
if redis.call('EXISTS', KEYS[1]) == 1 then
    return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
