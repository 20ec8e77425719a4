-- The plain lock's waiting owners, included by the scripts that hand the lock over (not run
-- alone).
--
-- A sorted set beside the lock (LockKeys.waiting): member '<lease ms> <n> <client> <owner>'
-- (the owner last: an explicit owner may hold spaces) -> its order (its client's clock in
-- microseconds when it entered).  An owner enters when a try of it is refused (lock/acquire.lua),
-- or when its client's holder releases the lock while it waits behind in that client (the
-- release's more argument below): one owner per client, not one per waiting task.  The release
-- that deletes a lock marked waited for (':w') grants it to the first member itself, for the
-- member's lease, with its request n, and publishes '=<token> <member>' on the channel of the
-- member's client only (the channels' prefix, passed as a key, carries the lock's Cluster
-- slot): that owner's call starts with no further try, and no other client wakes.  The hash marks such a grant 'q:<owner>' = n until its owner's
-- client takes it by a try (its message may be lost) or withdraws the owner (lock/wake.lua
-- gives it back then).  A client that died holds it for that lease, as a holder that died.
--
-- The set lives for the lease its waiters park under, plus two seconds (set by the refusals
-- that fill it, and by a holder's release now and then): an owner that entered after it
-- expired is in a set created by a refusal, or popped at once.  Nothing is left once every
-- member is granted or withdrawn.

-- Enter an owner (entry: '<order> <kept ms or -> <member>'; '' enters nobody): kept, the ms
-- the set lives from now on.
local function enter(waiting, entry)
    local order, kept, member = string.match(entry or '', '^(%d+) ([%d-]+) (.+)$')
    if member then
        redis.call('ZADD', waiting, 'NX', order, member)
        if kept ~= '-' then
            redis.call('PEXPIRE', waiting, kept)
        end
    end
end

-- The lock has just become free: grant it to the first member, and tell its client (on the
-- channel <prefix><client id>).  Returns the message ('=<token> <member>'), or false when no
-- member was there.
local function hand_over(lock, waiting, prefix, fence)
    local member = redis.call('ZPOPMIN', waiting)[1]
    if not member then
        return false
    end
    local ms, n, client, owner = string.match(member, '^(%d+) (%d+) (%S+) (.+)$')
    if not ms then
        return false  -- not one of ours: dropped
    end
    -- A hold as common/_hold.lua's grant() makes it, with 'q:<owner>' and ':w' (others may
    -- wait behind it) in the same write.
    local token = redis.call('INCR', fence)
    redis.call('HSET', lock, owner, '1', 'f:' .. owner, token, 'r:' .. owner, owner .. '/' .. n,
        'q:' .. owner, n, ':w', '1')
    redis.call('PEXPIRE', lock, ms)
    local message = '=' .. token .. ' ' .. member
    redis.call('PUBLISH', prefix .. client, message)
    return message
end
