-- Request ids and late copies, included after common/_time by the scripts that grant holds
-- (never run alone).
--
-- A request is '<owner>/<n>': n grows with every call of the owner's client, and an owner's
-- calls on one lock are sequential (its client waits for the settlement of an earlier call
-- before the next).  A late copy of a call can only exist after a fault the client saw: it
-- resent the call (its first copy went out on a connection that failed), or the call's
-- outcome stayed unknown (cancelled in flight, reply lost) and was settled by an undo.  A call
-- answered on a healthy connection has no other copy.  So the fault-free path writes no
-- marker at all, and only those fault paths do: '<owner>/<n>' in the meta hash, for each
-- acquire that must never apply (resent, or undone before it was applied), kept for the
-- client's resend window (a field per request, so that no marker replaces another; 'undone',
-- the single field of earlier versions, is still read).
--
-- Releases are refused by id, not by order (see late_release): an explicit owner may be used
-- by two tasks at once, whose calls can arrive out of order on two connections with no fault,
-- so a release older than the owner's last request is no late copy by itself.  The client
-- knows when a release may have a late copy (it resent it): once it is answered, and for the
-- resend window, the owner's acquires of that lock carry the release's id ('late:<ids>', one
-- more ARGV), and the hold they make or re-enter keeps it in the lock hash (':late:<owner>'),
-- where the release scripts read it with the fields they read anyway.
--
-- The window is the client's own (derived from its retry policy: how long after a call a copy
-- of it may still be on its way), passed by every call that may write a marker: an acquire's
-- resend mark, a release's ARGV after its undo, a void call's ARGV[2].  MARK_MS is for a
-- caller that passes none.
local MARK_MS = 60000

-- The marker lifetime in ms that a call passed (arg), at least a second; MARK_MS for none.
local function resend_ms(arg)
    local ms = tonumber(arg)
    if not ms then
        return MARK_MS
    end
    return math.min(math.max(math.floor(ms), 1000), 1e9)
end

-- How many fields the meta hash may hold before the marks past their time are pruned.
local PRUNE_ABOVE = 32

-- Mark acquire request (owner/n) as one that must never apply (see stale), for ms (the
-- client's resend window, from the call's ARGV: see resend_ms).
-- The field's value is the server time until which it is kept.  A hash that keeps getting
-- marks never expires as a whole, so marks past their time are pruned here, where they are
-- added (after faults only).
local function void_request(meta, request, ms)
    local now = now_ms()
    redis.call('HSET', meta, request, now + ms)
    keep(meta, ms)
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

-- Whether request is older than last, the owner's last request applied while it holds the
-- lock: a late copy of a call that was answered already (by a resend), not a new one.
local function older(owner, request, last)
    local n = #owner + 2
    return last ~= nil and last ~= false and last ~= request
        and string.sub(last, 1, n - 1) == owner .. '/'
        and tonumber(string.sub(request, n)) < tonumber(string.sub(last, n))
end

-- Whether request is a late copy that must not apply to a lock that is gone (or that its
-- owner no longer holds): an acquire undone before it arrived, or one its client voided
-- (it was resent: the resend voided it in its own script, and the client again before
-- the release that ends the hold the resend got, or when that hold is lost).  One read, of a
-- key that exists only while faults are recent.
local function stale(meta, owner, request)
    local marks = redis.call('HMGET', meta, request, 'undone')
    return marks[1] ~= false or marks[2] == request
end

-- A resent acquire (the client sent it again after its first copy went out on a connection
-- that failed) carries one more ARGV, the resend window in ms.  The acquire scripts then
-- void its request at the end of the same call, granted or refused: the first copy may
-- still arrive, and must grant nothing once the owner does not hold the lock (after a refusal,
-- once the lock is free; after a grant, once that hold has ended, by a release or by its
-- lease).  The client voids a hold's resent requests again when it ends (a hold may outlive
-- the window).

-- The optional ARGV after a script's own, from index first on: the resent releases whose late
-- copies the hold must refuse ('late:' .. their request ids, comma-separated), the fair
-- lock's flags 'fresh', 'once' and 'first', its 't:<ms>' and 'm:<member>' (see
-- fair/acquire.lua), and, last, a resend's mark (the resend window in ms: Calls.run's
-- mark_resends appends it).  Returns the ids (or nil), the mark (or nil), whether 'fresh',
-- 'once' and 'first' were there, the ms of 't:' and the member of 'm:' (or nil).  Neither ids
-- nor mark is there on the fault-free path.
local function optional_args(first)
    local late, resent, fresh, once, first_try, at, member
    for i = first, #ARGV do
        local arg = ARGV[i]
        if string.sub(arg, 1, 5) == 'late:' then
            late = string.sub(arg, 6)
        elseif arg == 'fresh' then
            fresh = true
        elseif arg == 'once' then
            once = true
        elseif arg == 'first' then
            first_try = true
        elseif string.sub(arg, 1, 2) == 't:' then
            at = tonumber(string.sub(arg, 3))
        elseif string.sub(arg, 1, 2) == 'm:' then
            member = string.sub(arg, 3)
        else
            resent = arg
        end
    end
    return late, resent, fresh, once, first_try, at, member
end

-- Whether request (owner/n) is a late copy of a release its client resent: n is one of the
-- ids in late (the ':late:<owner>' field of the lock hash, false or nil when there is none).
-- Its resend was applied, and the owner has acquired since (that acquire wrote the field), so
-- this copy must change nothing.
local function late_release(owner, request, late)
    if not late then
        return false
    end
    local n = string.sub(request, #owner + 2)
    return string.find(',' .. late .. ',', ',' .. n .. ',', 1, true) ~= nil
end
