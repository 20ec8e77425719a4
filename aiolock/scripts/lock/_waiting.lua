-- The plain lock's waiting clients, included by the scripts that wake them (not run alone).
--
-- A sorted set beside the lock (LockKeys.waiting): client id -> its order (the client's clock
-- in microseconds when it entered).  A client enters when a try of one of its calls is
-- refused (lock/acquire.lua), and again when it releases the lock while other calls of its
-- own wait (the more argument below).  The last release of a lock marked waited for (':w') pops the
-- first client and publishes its id: that client alone wakes one of its waiters, so one try
-- follows a release however many clients wait.  A client named that cannot use the wake-up
-- (its waiters left) hands it on (lock/wake.lua); one that died took it with it, and the
-- others try when the lease they parked under ends, as after a lost message.
--
-- The set lives for the lease its waiters park under, plus two seconds (set by the refusals
-- that fill it, and by a holder's release now and then): a client that entered after it
-- expired is in a set created by a refusal, or popped at once.  Nothing is left once every
-- client is named.

-- Name the next client (after entering this one, if more is '<order> <client>[ <ms>]'): pop
-- the first and publish '><its id>'; with nobody in the set, publish 'released', which wakes
-- one waiter in every client (a waiter of an earlier version, or one whose entry expired), as
-- any other message does (a force_unlock's 'forced').
local function name_next(waiting, channel, more)
    if more and more ~= '' then
        local order, client, ms = string.match(more, '^(%d+) (%S+) ?(%d*)$')
        if client then
            redis.call('ZADD', waiting, 'NX', order, client)
            if ms ~= '' then
                redis.call('PEXPIRE', waiting, ms)
            end
        end
    end
    local first = redis.call('ZPOPMIN', waiting)
    redis.call('PUBLISH', channel, first[1] and '>' .. first[1] or 'released')
end
