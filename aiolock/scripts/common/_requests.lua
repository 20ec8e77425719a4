-- Request ids and late copies, included after common/_time by the scripts that grant holds
-- (never run alone).
--
-- A request is '<owner>/<n>': n grows with every call of the owner's client, and an owner's
-- calls on one lock are sequential (its client waits for the settlement of an earlier call
-- before the next).  A late copy of a call (a resend after a reconnect, or a request a dead
-- connection delivered late) must not apply again, and an acquire its client undid before it
-- arrived must not apply at all.  The meta hash keeps markers for that while the lock is gone:
-- 'released' -> the request that last deleted the lock, and '<owner>/<n>' -> 1 for each
-- acquire that must never apply: undone before it was applied, or fenced off by its client
-- (common/fence.lua).  A field per request, so that no marker replaces another ('undone', the
-- single field of earlier versions, is still read).

-- How long a marker in the meta hash at least lives: late copies of a call (a resend after a
-- reconnect, a request a dead connection delivered late) come within seconds.
local MARK_MS = 60000

-- Record field = value in the meta hash, kept for at least ms (never shortened).
local function mark(meta, field, value, ms)
    redis.call('HSET', meta, field, value)
    keep(meta, ms)
end

-- How many fields the meta hash may hold before the marks past their time are pruned.
local PRUNE_ABOVE = 32

-- Mark acquire request (owner/n) as one that must never apply (see stale), for MARK_MS: the
-- field's value is the server time until which it is kept.  The hash of a lock in steady use
-- never expires as a whole (each release keeps it alive), so marks past their time are pruned
-- here, where they are added (after faults only: a resend, or an acquire undone unapplied).
local function fence_off(meta, request)
    local now = now_ms()
    mark(meta, request, now + MARK_MS, MARK_MS)
    if redis.call('HLEN', meta) > PRUNE_ABOVE then
        local fields = redis.call('HGETALL', meta)
        for i = 1, #fields, 2 do
            local until_ms = tonumber(fields[i + 1])
            if until_ms and until_ms < now and string.find(fields[i], '/', 1, true) then
                redis.call('HDEL', meta, fields[i])
            end
        end
    end
end

-- Whether request is older than last, the owner's last request applied: a late copy of a call
-- that was answered already (by a resend), not a new one.
local function older(owner, request, last)
    local n = #owner + 2
    return last ~= nil and last ~= false and last ~= request
        and string.sub(last, 1, n - 1) == owner .. '/'
        and tonumber(string.sub(request, n)) < tonumber(string.sub(last, n))
end

-- Whether request is a late copy that must not apply to a lock that is gone (or that its
-- owner no longer holds): an acquire undone before it arrived; one its client fenced off
-- (common/fence.lua: it was resent, and the resend answered); or one older than the request
-- that last deleted the lock, when that was the same owner's (a late copy of an acquire its
-- resend answered, arriving after the owner released what the resend got; the marker lives
-- as long as the lease it ended).
local function stale(meta, owner, request)
    local marks = redis.call('HMGET', meta, 'undone', 'released', request)
    return marks[1] == request or marks[3] ~= false or older(owner, request, marks[2])
end

-- A resent acquire (the client sent it again after its first copy went out on a connection
-- that failed) carries one more ARGV, set.  The acquire scripts then fence its request off at
-- the end of the same call, granted or refused: the first copy may still arrive, and must
-- grant nothing once the owner does not hold the lock (after a refusal, once the lock is
-- free; after a grant, once that hold has ended, by a release or by its lease).  Marks live
-- MARK_MS; the client fences a longer hold's resent requests again when it ends.
