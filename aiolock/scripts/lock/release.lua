-- Release one hold of a reentrant lock; the last release deletes it and wakes a waiter.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash: an undo of an acquire that was not applied marks '<owner>/<n>'
--          there (see common/_requests.lua); nothing else is written to it
-- KEYS[3]  optional: the prefix of the lock's channels, one per client (a key, so Cluster
--          routes it with the lock); a kind whose waiters do not subscribe (the spin lock)
--          passes none, and nothing is published
-- KEYS[4]  with KEYS[3]: the lock's waiting owners (lock/_waiting.lua)
-- KEYS[5]  with KEYS[3]: the fencing token counter (a grant from the set takes a token)
-- ARGV[1]  owner id
-- ARGV[2]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[3]  '' or, when other calls of the owner's client wait for the lock, '+' if one of
--          their owners is in the set, else '<order> <ms or -> <member>': that owner enters
--          the waiting set (and the set is kept <ms> longer), by this release whether it is
--          the owner's last or not (if it releases: not a resend or a late copy); either way,
--          the last release hands the lock over, marked waited for or not
-- ARGV[4]  optional: undo mode, the id of an acquire request whose outcome the caller never
--          saw (it was cancelled); release only if that acquire was the owner's last request
-- ARGV[5]  with ARGV[4]: the client's resend window in ms, how long the marker of an undo that
--          was not applied lives
--
-- Returns the holds the owner has left (0: the lock was deleted), or nil when the owner does
-- not hold the lock; the grant's message instead of 0 ('=<token> <member>', as published) when
-- it grants the lock to a member: a client whose waiter it names hands it the grant from the
-- reply, not when the message comes.  The release that deletes the lock grants it to the first
-- member of the waiting set (lock/_waiting.lua) if it was marked waited for (':w': a waiter
-- was refused by this incarnation, or it was granted to a waiter, who may have left others in
-- the set), or if other calls of the owner's client wait.
--
-- Idempotent: a resend of an applied request never releases twice.  A resend of the release
-- that deleted the lock answers nil (no marker outlives the lock); its client knows it
-- resent and takes that for released.  A late copy of a resent release, arriving once the
-- owner acquired again (':late:<owner>' names it, see common/_hold), changes nothing and
-- answers the holds left.  Commands: HMGET, then DEL (and ZADD, ZPOPMIN, and INCR, HSET,
-- PEXPIRE and the publish if a member is granted) for the last hold, HSET for an inner one.
--@include lock/_waiting
local owner, request = ARGV[1], ARGV[1] .. '/' .. ARGV[2]
local held = redis.call('HMGET', KEYS[1], owner, 'r:' .. owner, ':w', ':late:' .. owner)
-- The fault-free last release comes first, before the helpers below (defining them costs the
-- server more than this path): the owner's one hold, no undo, not a resend of the request
-- applied last, no resent release of this owner around.
if held[1] == '1' and not ARGV[4] and held[2] ~= request and not held[4] then
    redis.call('DEL', KEYS[1])
    if (held[3] or ARGV[3] ~= '') and KEYS[4] then
        enter(KEYS[4], ARGV[3])
        return hand_over(KEYS[1], KEYS[4], KEYS[3], KEYS[5]) or 0
    end
    return 0
end

--@include common/_time
--@include common/_requests
--@include common/_hold
local undo = ARGV[4] and owner .. '/' .. ARGV[4]
local left, deleted, waited, applied = release_one(KEYS[1], KEYS[2], owner, request, undo, held, 5)
if KEYS[4] then
    -- Entered by any release that carries it, the last or not: the client counts it entered.
    -- Not by a resend or a late copy, whose member a grant may have taken since.
    if applied then
        enter(KEYS[4], ARGV[3])
    end
    if deleted and (waited or ARGV[3] ~= '') then
        return hand_over(KEYS[1], KEYS[4], KEYS[3], KEYS[5]) or left
    end
end
return left
