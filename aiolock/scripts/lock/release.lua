-- Release one hold of a reentrant lock; the last release deletes it and wakes a waiter.
--
-- KEYS[1]  the lock hash
-- KEYS[2]  the meta hash: an undo of an acquire that was not applied marks '<owner>/<n>'
--          there (see common/_requests.lua); nothing else is written to it
-- KEYS[3]  optional: the lock's channel (a key, so Cluster routes it with the lock); a kind
--          whose waiters do not subscribe (the spin lock) passes none, and nothing is published
-- ARGV[1]  owner id
-- ARGV[2]  request id, unique per call of this owner; a resent call carries the same id
-- ARGV[3]  optional: undo mode, the id of an acquire request whose outcome the caller never
--          saw (it was cancelled); release only if that acquire was the owner's last request
-- ARGV[4]  with ARGV[3]: the client's resend window in ms, how long the marker of an undo that
--          was not applied lives
--
-- Returns the holds the owner has left (0: the lock was deleted), or nil when the owner does
-- not hold the lock.  The release that deletes the lock publishes only if a waiter was refused
-- by this incarnation of it (':w', set by the refusal): one that was refused by an earlier
-- one was woken by that one's release, and tried again (then refused by this one) or won.
-- The client wakes its own parked waiters itself when its release deletes the lock.
--
-- Idempotent: a resend of an applied request never releases twice.  A resend of the release
-- that deleted the lock answers nil (no marker outlives the lock); its client knows it
-- resent and takes that for released.  A late copy of a resent release, arriving once the
-- owner acquired again (':late:<owner>' names it, see common/_hold), changes nothing and
-- answers the holds left.  Commands: HMGET, then DEL (and the publish if a waiter was
-- refused) for the last hold, HSET for an inner one.
local owner, request = ARGV[1], ARGV[1] .. '/' .. ARGV[2]
local held = redis.call('HMGET', KEYS[1], owner, 'r:' .. owner, ':w', ':late:' .. owner)
-- The fault-free last release comes first, before the helpers below (defining them costs the
-- server more than this path): the owner's one hold, no undo, not a resend of the request
-- applied last, no resent release of this owner around.
if held[1] == '1' and not ARGV[3] and held[2] ~= request and not held[4] then
    redis.call('DEL', KEYS[1])
    if held[3] and KEYS[3] then
        redis.call('PUBLISH', KEYS[3], 'released')
    end
    return 0
end

--@include common/_time
--@include common/_requests
--@include common/_hold
local undo = ARGV[3] and owner .. '/' .. ARGV[3]
local left, deleted, waited = release_one(KEYS[1], KEYS[2], owner, request, undo, held)
if deleted and waited and KEYS[3] then
    redis.call('PUBLISH', KEYS[3], 'released')
end
return left
