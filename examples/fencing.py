"""Fencing tokens: storage rejects a writer that lost its lock.

A lock can be lost while its holder still runs (a pause longer than the lease).  The holder
that lost it may then write after the new holder did.  Each fresh acquisition gets a larger
fencing token; the store keeps the largest token it has seen and refuses writes that carry a
smaller one.  Here the store is a Redis hash updated by a conditional script; a SQL table would
do the same with ``UPDATE … SET value = ?, fence = ? WHERE id = ? AND fence < ?``.

Run: python examples/fencing.py [REDIS_URL]   (default: an embedded server)
"""

from __future__ import annotations

import asyncio
import sys

from redis.asyncio import Redis

import aiolock

# KEYS[1] the record; ARGV[1] the value; ARGV[2] the writer's fencing token.
# Returns 1 if written, 0 if a newer holder already wrote.
CONDITIONAL_WRITE = """
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[2]) <= fence then
    return 0
end
redis.call('HSET', KEYS[1], 'value', ARGV[1], 'fence', ARGV[2])
return 1
"""


async def write(redis: Redis, value: str, token: int) -> bool:
    written = await redis.eval(CONDITIONAL_WRITE, 1, "example:record", value, token)
    return bool(written)


async def main(url: str) -> list[bool]:
    async with aiolock.Client.from_url(url) as slow, aiolock.Client.from_url(url) as fast:
        redis = Redis.from_url(url)
        await redis.delete("example:record")
        results = []
        try:
            async with slow.lock("record").acquire(lease=0.2) as stale:
                # The slow writer stalls past its lease; the fast one takes the lock and writes.
                async with fast.lock("record").acquire(wait=5) as fresh:
                    results.append(await write(redis, "from the new holder", fresh.fencing_token))
                # Now the stale writer wakes up and tries to write with its old token.
                results.append(await write(redis, "from the stale holder", stale.fencing_token))
        except aiolock.LockLostError as exc:
            print("the stale holder learns it lost the lock:", exc)
        print("record:", await redis.hgetall("example:record"))
        print("new holder wrote:", results[0], "- stale holder wrote:", results[1])
        await redis.delete("example:record")
        await redis.aclose()
        return results


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            asyncio.run(main(server.url))
