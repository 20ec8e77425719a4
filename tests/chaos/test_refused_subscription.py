"""The subscriber connection cannot be opened for a while: the lock's subscription stays pending.

The waiters must neither turn the failure into a storm of tries nor be stranded: once the server
accepts connections again, the reader subscribes the pending channel, and a release then wakes
them one by one, promptly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import (
    assert_clean,
    entry_of,
    evalsha_calls,
    eventually,
    hold_as_stranger,
    keys_of,
    parked,
    services_of,
)

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def behind_proxy(proxied: Callable[..., aiolock.Client]) -> aiolock.Client:
    return proxied()


async def held_elsewhere_and_refused(
    client: aiolock.Client, name: str, redis: Redis, proxy: FreezableProxy
) -> aiolock.AsyncRLock:
    """``name``'s lock, held by a stranger that never publishes, with new connections refused.

    The client's script connection is opened first, so only the subscriber connection fails.
    """
    lock = client.lock(name)
    assert await lock.try_lock()
    await lock.unlock()
    await hold_as_stranger(redis, lock, 30_000)
    proxy.refuse = True
    return lock


async def test_waiters_outlast_a_refused_subscriber_connection(
    behind_proxy: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = behind_proxy
    lock = await held_elsewhere_and_refused(client, "refused", redis, proxy)
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            served.append(i)

    def refusals() -> int:
        return sum("pub/sub connection failed" in r.getMessage() for r in caplog.records)

    before = await evalsha_calls(redis)
    with caplog.at_level(logging.WARNING, logger="aiolock.pubsub"):
        waiters = [asyncio.create_task(waiter(i)) for i in range(3)]
        await eventually(lambda: refusals() >= 3, what="three refused connections")
        assert parked(client, lock) == 3
        assert await evalsha_calls(redis) - before == 1  # the first try, and no more
        proxy.refuse = False
        entry = entry_of(client, lock)
        assert entry is not None
        await eventually(lambda: entry.confirmed, what="the pending SUBSCRIBE confirmed")
        # The confirmation woke the head, whose try finds the stranger's lock: let it park
        # again, at the front.  Released while it is still out trying, the lock could go to it
        # before the PUBLISH below, which would then be a second wake-up: the next two waiters
        # would try at once, and the later one might win.
        await eventually(lambda: parked(client, lock) == 3, what="the head parked again")
        await redis.delete(keys_of(lock).lock)
        await redis.publish(keys_of(lock).channel, "released")
        # Stranded, they would wait out the stranger's 30 s lease.
        await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert served == [0, 1, 2]
    await assert_clean(redis, client)


async def test_closing_the_client_ends_waiters_on_a_pending_subscription(
    behind_proxy: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = behind_proxy
    lock = await held_elsewhere_and_refused(client, "closing", redis, proxy)
    with caplog.at_level(logging.WARNING, logger="aiolock.pubsub"):
        waiters = [asyncio.create_task(lock.try_lock(wait=30)) for _ in range(3)]
        await eventually(lambda: parked(client, lock) == 3)
        await client.aclose()
    outcomes = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5)
    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes), outcomes
    assert lock.statistics().waiters == 0
    assert not services_of(client).pubsub.scheduled
    await redis.delete(keys_of(lock).lock)
