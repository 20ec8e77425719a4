-- The queued commands of a transaction (guard.transaction()), included by each kind's
-- transact script after it has checked the hold (never run alone).
--
-- ARGV from index first: the number of commands, then for each command its argument count
-- and its arguments (the command name first).  The client refused, before sending, every
-- command a script may not run, and passed every key the commands touch as KEYS.

-- Run the queued commands, in order, as EXEC runs a MULTI's: a command that fails (a wrong
-- type, say) leaves its error reply in its place and the others still run.  Returns the list
-- of replies.
local function run_queued(first)
    local replies = {}
    local i = first + 1
    for c = 1, tonumber(ARGV[first]) do
        local argc = tonumber(ARGV[i])
        replies[c] = redis.pcall(unpack(ARGV, i + 1, i + argc))
        i = i + argc + 1
    end
    return replies
end
