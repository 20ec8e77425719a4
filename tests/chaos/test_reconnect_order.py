"""FIFO within a client survives a lost subscriber connection.

A reconnect wakes the first parked waiter of each resubscribed channel (a release may have
been missed), and a grant wakes the next as it goes.  Waking them all at once (as this client
once did) let the lock go to whichever try landed first: a run on a loaded machine served
``[0, 3, 1, 2]`` when the release raced the resubscription.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import (
    entry_of,
    eventually,
    hold_as_stranger,
    keys_of,
    parked,
    services_of,
)

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


async def served_after_a_reconnect(
    client: aiolock.Client, proxy: FreezableProxy, redis: Redis, lock: aiolock.AsyncRLock
) -> list[int]:
    """Park 4 waiters in a known order, cut every connection, then release once."""
    pubsub = services_of(client).pubsub
    await hold_as_stranger(redis, lock, 30_000)
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            served.append(i)

    tasks = []
    for i in range(4):  # one at a time, so that the order they asked in is known
        tasks.append(asyncio.create_task(waiter(i)))
        count = i + 1
        await eventually(lambda: parked(client, lock) == count, what=f"{i} parked")  # noqa: B023
    entry = entry_of(client, lock)
    assert entry is not None
    await eventually(lambda: entry.confirmed, what="subscribed")
    reconnects = pubsub.statistics().reconnects

    def reconnected() -> bool:
        stats = pubsub.statistics()
        return stats.reconnects > reconnects and stats.connected

    proxy.reset()  # every connection through the proxy, the subscriber's included
    await eventually(reconnected, what="reconnected")
    # Woken by the resubscription, every waiter tried (the stranger still holds it) and
    # parked again.
    await eventually(lambda: parked(client, lock) == 4 and entry.permits == 0, what="back")
    await redis.delete(keys_of(lock).lock)
    await redis.publish(keys_of(lock).channel, "released")
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    return served


async def test_waiters_keep_their_order_across_a_reconnect(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy, redis: Redis
) -> None:
    client = proxied()
    lock = client.lock("reconnected")
    for round_ in range(3):
        served = await served_after_a_reconnect(client, proxy, redis, lock)
        assert served == [0, 1, 2, 3], f"round {round_}: {served}"
