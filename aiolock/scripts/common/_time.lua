-- Time and key lifetimes, included by the scripts that keep deadlines on the server's clock.

-- The server's clock in milliseconds (scripts replicate their effects, so TIME is allowed).
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Keep key alive at least ms longer (never shortened).
local function keep(key, ms)
    if redis.call('PTTL', key) < ms then
        redis.call('PEXPIRE', key, ms)
    end
end
