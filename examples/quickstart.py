"""The basics: acquire with a wait, re-enter, inspect, release.

Run: python examples/quickstart.py [REDIS_URL]   (default: an embedded server)
"""

from __future__ import annotations

import asyncio
import sys

import aiolock


async def main(url: str) -> None:
    async with aiolock.Client.from_url(url) as client:
        lock = client.lock("orders:42")

        async with lock.acquire(wait=5) as guard:  # the watchdog keeps it alive meanwhile
            print(f"held {lock.name!r} with fencing token {guard.fencing_token}")
            async with lock:  # the same task may re-enter
                print("hold count:", await lock.hold_count())
            other = asyncio.create_task(lock.try_lock(wait=0))  # another task: another owner
            print("another task could take it:", await other)

        print("locked after the block:", await lock.is_locked())

        if await lock.try_lock(wait=1, lease=10):  # a fixed lease: gone in 10 s at the latest
            try:
                print(f"remaining lease: {await lock.remaining_lease():.1f}s")
            finally:
                await lock.unlock()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            asyncio.run(main(server.url))
