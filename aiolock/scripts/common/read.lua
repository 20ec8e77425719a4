-- Read one key of a lock for the inspecting calls (is_locked, hold_count, a latch's count...).
-- A script, so that these reads run on the client's own connections like every other call:
-- redis-py's command path may swallow its caller's cancellation on Python 3.11 (see _calls).
--
-- KEYS[1]  the key
-- ARGV[1]  what to read: 'exists', 'pttl', 'get', or 'hget' (ARGV[2]: the field)
--
-- Returns that command's reply.
local what = ARGV[1]
if what == 'exists' then
    return redis.call('EXISTS', KEYS[1])
elseif what == 'pttl' then
    return redis.call('PTTL', KEYS[1])
elseif what == 'get' then
    return redis.call('GET', KEYS[1])
elseif what == 'hget' then
    return redis.call('HGET', KEYS[1], ARGV[2])
end
return redis.error_reply('ERR aiolock: unknown read ' .. tostring(what))
