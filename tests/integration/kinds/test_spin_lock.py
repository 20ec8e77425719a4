"""The spin lock's own behaviour: it never subscribes, its backoff is bounded by ``max_delay``
and by the lock's remaining lease, and its options are checked before any I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import (
    assert_clean,
    channels,
    evalsha_calls,
    eventually,
    keys_of,
    server_calls_of,
    services_of,
)

pytestmark = pytest.mark.anyio


async def subscribe_calls(redis: Redis, command: str = "subscribe") -> int:
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def hold_as_stranger(redis: Redis, lock: aiolock.AsyncSpinLock, lease_ms: int) -> None:
    """Make ``lock`` held by a foreign owner for ``lease_ms``; it never publishes a release."""
    await redis.hset(keys_of(lock).lock, "someone-else", 1)
    await redis.pexpire(keys_of(lock).lock, lease_ms)


async def test_it_never_subscribes(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client()]
    subscribes = await subscribe_calls(redis)
    publishes = await subscribe_calls(redis, "publish")
    inside = peak = entered = 0
    samples: list[tuple[list[str], int, int]] = []
    waiting_seen = 0
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal waiting_seen
        while not done.is_set():
            subscriptions = sum(client.statistics().subscriptions for client in clients)
            waiting = sum(client.spin_lock("spun").statistics().waiters for client in clients)
            waiting_seen = max(waiting_seen, waiting)
            samples.append((await channels(redis, aiolock_client), subscriptions, waiting))
            await asyncio.sleep(0.002)  # a sampling interval, not a synchronisation

    async def worker(i: int) -> None:
        nonlocal inside, peak, entered
        lock = clients[i % 2].spin_lock("spun")
        for _ in range(3):
            async with lock.acquire(wait=30):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.002)
                inside -= 1
                entered += 1

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(worker(i) for i in range(10)))
    done.set()
    await watcher
    assert (peak, entered) == (1, 30)
    assert waiting_seen > 0  # there was contention
    assert samples
    assert all(found == [] and subscriptions == 0 for found, subscriptions, _ in samples)
    assert await subscribe_calls(redis) == subscribes
    assert await subscribe_calls(redis, "publish") == publishes  # nobody would listen
    assert await clients[0].spin_lock("spun").force_unlock() is False
    for client in clients:
        assert not services_of(client).pubsub.subscriber_homes  # no subscriber connection, ever
        await assert_clean(redis, client)


async def test_a_release_is_noticed_within_max_delay(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.spin_lock("bounded", owner="holder")
    waiter = make_client().spin_lock("bounded", initial_delay=0.001, max_delay=0.02)
    await holder.lock()  # the watchdog lease: 30 s, so the lease does not bound the pauses
    loop = asyncio.get_running_loop()

    async def wait() -> float:
        assert await waiter.try_lock(wait=30)
        granted = loop.time()
        await waiter.unlock()
        return granted

    task = asyncio.create_task(wait())
    await eventually(lambda: waiter.statistics().waiters == 1, what="the waiter backs off")
    tries = await evalsha_calls(redis)
    # Long enough for an unbounded doubling from 1 ms to reach pauses of a second or more.
    await asyncio.sleep(1.5)
    tries = await evalsha_calls(redis) - tries
    assert not task.done()
    released = loop.time()
    await holder.unlock()
    granted = await task
    assert granted - released < 0.25
    # Pauses average at most max_delay / 2 = 10 ms: some 150 tries in 1.5 s (an unbounded
    # doubling makes about 11).  And it does not spin either.
    assert 40 < tries < 1500, tries


async def test_a_fixed_lease_bounds_every_pause(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """Pauses drawn from up to 5 s are cut to the stranger's remaining lease of 0.3 s."""
    lock = aiolock_client.spin_lock("leased", initial_delay=5, max_delay=5)
    loop = asyncio.get_running_loop()
    for _ in range(3):
        await hold_as_stranger(redis, lock, 300)
        started = loop.time()
        assert await lock.try_lock(wait=10)
        waited = loop.time() - started
        await lock.unlock()
        assert 0.25 < waited < 0.7, waited
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize(
    ("options", "error", "param"),
    [
        ({"initial_delay": -1}, ValueError, "initial_delay"),
        ({"initial_delay": 0}, ValueError, "initial_delay"),
        ({"initial_delay": float("nan")}, ValueError, "initial_delay"),
        ({"initial_delay": float("inf")}, ValueError, "initial_delay"),
        ({"initial_delay": True}, TypeError, "initial_delay"),
        ({"initial_delay": "0.1"}, TypeError, "initial_delay"),
        ({"initial_delay": None}, TypeError, "initial_delay"),
        ({"max_delay": -0.5}, ValueError, "max_delay"),
        ({"max_delay": float("nan")}, ValueError, "max_delay"),
        ({"max_delay": float("-inf")}, ValueError, "max_delay"),
        ({"max_delay": False}, TypeError, "max_delay"),
        ({"max_delay": [1]}, TypeError, "max_delay"),
        ({"initial_delay": 0.5, "max_delay": 0.1}, ValueError, "max_delay"),
        ({"max_delay": 0.0005}, ValueError, "max_delay"),  # below the default initial_delay
    ],
)
async def test_bad_backoff_options_fail_before_any_io(
    options: dict[str, Any], error: type[Exception], param: str
) -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    try:
        with pytest.raises(error, match=param):
            client.spin_lock("x", **options)
        lock = client.spin_lock("x", initial_delay=0.5, max_delay=0.5)  # equal bounds are fine
        assert lock.statistics().waiters == 0
        assert server_calls_of(client).connections == 0  # nothing was sent anywhere
    finally:
        await client.aclose()
