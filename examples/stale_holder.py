"""A stale holder's write is refused: ``guard.transaction()`` checks the hold in the same call.

A holder paused longer than its lease (a GC pause, a stopped VM, a swapped-out process) does
not know that it lost its lock: its timers were paused too.  Meanwhile another client took the
lock and changed the data.  When the paused holder wakes up and writes through
``guard.transaction()``, one atomic script call checks on the server that the holder still
holds the lock with its fencing token before it runs the queued commands: the write is
refused, none of it lands, and the holder gets ``LockLostError``.

For data kept outside Redis (a SQL table, say), see ``fencing.py``: there the storage itself
must compare fencing tokens.

Run: python examples/stale_holder.py [REDIS_URL]   (default: an embedded server)
"""

from __future__ import annotations

import asyncio
import sys
import threading

from redis.asyncio import Redis

import aiolock

NAME = "group:7"


def members_key(client: aiolock.Client) -> str:
    # The lock's hash tag puts the data in the lock's slot (a Redis Cluster needs that).
    return f"example:{client.lock(NAME).hash_tag}:members"


def stale_holder(url: str, paused: threading.Event, wake: threading.Event) -> None:
    """A process of its own, in effect: a thread with its own event loop and client."""

    async def run() -> None:
        async with aiolock.Client.from_url(url) as client:
            try:
                async with client.lock(NAME).acquire(wait=5, lease=0.5) as guard:
                    paused.set()
                    wake.wait(10)  # the pause: this event loop stands still, timers and all
                    print("stale holder wakes up, still believing it holds the lock")
                    try:
                        async with guard.transaction() as tx:
                            tx.sadd(members_key(client), "added by the stale holder")
                    except aiolock.LockLostError as exc:
                        print("stale holder's write was refused:", exc)
            except aiolock.LockLostError:
                pass  # leaving the block of a lost hold says so too

    asyncio.run(run())


async def main(url: str) -> set[str]:
    paused, wake = threading.Event(), threading.Event()
    thread = threading.Thread(target=stale_holder, args=(url, paused, wake))
    thread.start()
    await asyncio.to_thread(paused.wait, 10)
    async with aiolock.Client.from_url(url) as client:
        redis: Redis = Redis.from_url(url, decode_responses=True)
        key = members_key(client)
        try:
            # Waits until the paused holder's lease has run out on the server.
            async with client.lock(NAME).acquire(wait=5) as guard:
                async with guard.transaction() as tx:
                    tx.sadd(key, "added by the new holder")
                print("new holder wrote, with fencing token", guard.fencing_token)
                wake.set()
                await asyncio.to_thread(thread.join, 10)
            members = {str(member) for member in await redis.smembers(key)}
            print("members:", sorted(members))
            return members
        finally:
            wake.set()
            await redis.delete(key)
            await redis.aclose()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            asyncio.run(main(server.url))
