"""The subscriber connection cannot be opened: every SUBSCRIBE fails, and its entry dies.

The lock's waiters must neither trust the dead entry (they would never hear a release) nor turn
the failure into a storm of tries: they park on a fresh subscription until the server accepts
connections again, and a release then wakes them one by one, promptly.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, evalsha_calls, eventually, hold_as_stranger, parked

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


async def test_waiters_outlast_a_refused_subscriber_connection(
    aiolock_client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = aiolock.Client.from_url(
        f"redis://127.0.0.1:{proxy.port}/0", key_prefix=aiolock_client.key_prefix
    )
    try:
        lock = client.lock("refused")
        assert await lock.try_lock()  # the script connection is open before the refusals
        await lock.unlock()
        await hold_as_stranger(redis, lock, 30_000)  # never published: only a release wakes
        proxy.refuse = True
        served: list[int] = []

        async def waiter(i: int) -> None:
            async with lock.acquire(wait=30):
                served.append(i)

        def refusals() -> int:
            return sum("pub/sub connection failed" in r.getMessage() for r in caplog.records)

        before = await evalsha_calls(redis)
        with caplog.at_level(logging.WARNING, logger="aiolock.pubsub"):
            waiters = [asyncio.create_task(waiter(i)) for i in range(3)]
            await eventually(lambda: refusals() >= 3, what="three failed SUBSCRIBEs")
            await eventually(lambda: parked(client, lock) == 3, what="all parked anew")
            assert await evalsha_calls(redis) - before == 1  # the first try, and no more
            proxy.refuse = False
            await eventually(lambda: client.statistics().subscriptions == 1)
            await redis.delete(lock._keys.lock)
            await redis.publish(lock._keys.channel, "released")
            # Stranded on a dead entry, they would wait out the stranger's 30 s lease.
            await asyncio.wait_for(asyncio.gather(*waiters), 10)
        assert served == [0, 1, 2]
        await assert_clean(redis, client)
    finally:
        proxy.refuse = False
        await client.aclose()
