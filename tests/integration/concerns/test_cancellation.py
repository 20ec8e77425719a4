"""Cancellation at any await point leaves no lock held and no subscription behind.

Each round starts a victim task that acquires (often having to wait, so it subscribes), holds,
re-enters and releases, and cancels it at a random moment: after a random number of event-loop
iterations, which lands the cancellation on every kind of await point over many rounds.  After
each round the server must have no lock key and no channel left, and the client no hold, waiter
or pending work.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.connection import Connection as RedisConnection

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import (
    assert_clean,
    entries_of,
    eventually,
    hold_as_stranger,
    keys_of,
)

pytestmark = pytest.mark.anyio

ROUNDS = 300


async def victim(lock: aiolock.AsyncRLock, rng: random.Random) -> None:
    style = rng.randrange(4)
    if style == 0:
        async with lock.acquire(wait=2):
            async with lock.acquire():
                await asyncio.sleep(0)
    elif style == 1:
        if await lock.try_lock(wait=2, lease=5):
            try:
                await asyncio.sleep(0)
            finally:
                await lock.unlock()
    elif style == 2:
        async with lock.acquire(wait=2, cancel_on_loss=True):
            await asyncio.sleep(0)
    else:
        await lock.lock()
        try:
            await lock.lock()
            try:
                await asyncio.sleep(0)
            finally:
                await lock.unlock()
        finally:
            await lock.unlock()


async def spin(iterations: int) -> None:
    for _ in range(iterations):
        await asyncio.sleep(0)


# The matrix (noxfile.py) found this hanging on Python 3.12 and 3.13: waiting for the pub/sub
# work to end spun forever once a task had ended but not yet left its set (tasks.py).  The
# timeout keeps such a hang to a minute, where the test takes seconds.
@pytest.mark.timeout(60)
async def test_random_cancellations_leave_nothing_behind(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    rng = random.Random(20261121)
    lock = aiolock_client.lock("cancel-storm")
    outcomes = {"cancelled": 0, "finished": 0}
    for _ in range(ROUNDS):
        holder_release = asyncio.Event()
        holder_has_it = asyncio.Event()
        contended = rng.random() < 0.6

        async def holder(
            release: asyncio.Event = holder_release, has_it: asyncio.Event = holder_has_it
        ) -> None:
            async with lock.acquire():
                has_it.set()
                await release.wait()

        holder_task = asyncio.create_task(holder()) if contended else None
        releaser = None
        if holder_task is not None:
            await holder_has_it.wait()
            # Release the holder at a random moment too, racing the victim's wait.
            releaser = asyncio.create_task(_set_after(holder_release, rng.randrange(40)))
        task = asyncio.create_task(victim(lock, rng))
        await spin(rng.randrange(60))
        task.cancel()
        try:
            await task
            outcomes["finished"] += 1
        except asyncio.CancelledError:
            outcomes["cancelled"] += 1
        holder_release.set()
        if holder_task is not None and releaser is not None:
            await asyncio.gather(holder_task, releaser)
        await assert_clean(redis, aiolock_client)
    # Both outcomes happened many times: the cancellations really landed mid-operation.
    assert outcomes["cancelled"] > ROUNDS / 4, outcomes
    assert outcomes["finished"] > 5, outcomes


async def _set_after(event: asyncio.Event, iterations: int) -> None:
    await spin(iterations)
    event.set()


async def test_cancelled_waiter_passes_its_wake_up_on(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A waiter cancelled right after being woken hands the wake-up to the next waiter.

    The lock is held by a foreign owner with a 30 s lease and then deleted without a message, so
    the only thing that can wake the second waiter in time is the first one, as it leaves.
    """
    lock = aiolock_client.lock("pass-it-on")
    await hold_as_stranger(redis, lock, 30_000)
    key = keys_of(lock).channel.encode()
    entries = entries_of(aiolock_client)
    first = asyncio.create_task(lock.try_lock(wait=30))
    await eventually(lambda: key in entries and entries[key].parked == 1)

    async def second_waiter() -> bool:
        acquired = await lock.try_lock(wait=30)
        await lock.unlock()
        return acquired

    second = asyncio.create_task(second_waiter())
    await eventually(lambda: entries[key].parked == 2)
    await redis.delete(keys_of(lock).lock)  # freed, and no message published
    entries[key].wake_one()  # as if a message arrived: it goes to `first`...
    first.cancel()  # ...which is cancelled before it can use it
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 5)
    await assert_clean(redis, aiolock_client)


class _SwallowsACancel(RedisConnection):
    """A connection whose handshake swallows one cancellation, as redis-py's does on Python
    3.11 when ``asyncio.wait_for`` (under a ``socket_timeout``) finishes as it is cancelled."""

    connecting: asyncio.Event | None = None

    async def connect(self) -> None:
        if _SwallowsACancel.connecting is not None:
            _SwallowsACancel.connecting.set()
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: it carries on
                await asyncio.sleep(0.5)  # the test closes the client meanwhile
        await super().connect()  # type: ignore[no-untyped-call]


async def test_closing_while_the_subscriber_connects_does_not_hang(
    aiolock_server: ServerInfo,
) -> None:
    """Found by CI: a close that landed in the subscriber connection's handshake was swallowed,
    and ``aclose`` waited forever for the reader."""
    pool = ConnectionPool.from_url(aiolock_server.url, connection_class=_SwallowsACancel)
    client = aiolock.Client(Redis(connection_pool=pool))
    holder = client.lock("closing-mid-connect", owner="holder")
    await holder.lock()
    connecting = _SwallowsACancel.connecting = asyncio.Event()
    waiter = asyncio.create_task(client.lock("closing-mid-connect").lock())
    await connecting.wait()  # the reader is in its handshake
    _SwallowsACancel.connecting = None
    try:
        async with asyncio.timeout(10):
            await client.aclose()
            with pytest.raises(RuntimeError, match="closed"):
                await waiter
    finally:
        _SwallowsACancel.connecting = None
        await pool.aclose()
