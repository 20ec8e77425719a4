-- The semaphore's permits, included by its scripts after common/_time and common/_requests
-- (not run alone).
--
-- KEYS[1] is a sorted set: permit id -> the server time in ms at which its lease ends.  A
-- permit past its lease is no longer held: it is dropped by the next call that looks; the set
-- goes with its last permit.  The void marks live in a sorted set of their own (the marks key,
-- passed by the scripts that read or write them): '<permit id>/<request>' -> the server time
-- until which that acquire request must grant nothing (a late copy of it may still arrive: it
-- was resent, or undone before it was applied).  Marks are written on those fault paths only,
-- and their key lives for the client's resend window: kept in the permits set, they lived as
-- long as the longest lease granted since (ten minutes for lease=600), after every permit was
-- gone.  Earlier versions kept them in the permits set with negative scores: drop_expired
-- still drops those past their time.
--
-- The semaphore's count (its number of permits) is kept in the same set, as the member
-- ':permits' (no permit id starts with a colon) scored COUNT_BASE - count: far below any lease
-- end and any mark, so that neither held() nor drop_expired ever meets it.  The first acquirer
-- while no permit is held sets it, set_permits changes it, and it goes with the set's last
-- permit, so it lasts exactly while anyone holds a permit (a waiter waits only while permits
-- are held).  Callers check it in the same call that would grant (acquire.lua).
local COUNT = ':permits'
local COUNT_BASE = -1e15

-- The count a score of COUNT says (nil for none: false, as ZMSCORE answers a missing member).
local function count_of(score)
    local value = tonumber(score)
    return value and COUNT_BASE - value
end

-- Drop the permits whose lease ended (and marks of earlier versions past their time);
-- returns the time used.
local function drop_expired()
    local now = now_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. -now, now)
    return now
end

-- How many permits are held (after drop_expired).
local function held()
    return redis.call('ZCOUNT', KEYS[1], '(0', '+inf')
end

-- Mark acquire request (permit id/request id) as one that must never grant, for ms, in the
-- marks key; marks past their time are dropped here, where marks are added (after faults).
local function void_permit_request(marks, request, now, ms)
    redis.call('ZREMRANGEBYSCORE', marks, '-inf', now)
    redis.call('ZADD', marks, now + ms, request)
    keep(marks, ms)
end
