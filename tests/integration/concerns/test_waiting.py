"""Waiting: pub/sub wake-ups, one subscription per channel, wake-one, TTL-bounded waits."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import (
    assert_clean,
    channels,
    entries_of,
    entry_of,
    evalsha_calls,
    eventually,
    hold_as_stranger,
    keys_of,
    parked,
    services_of,
    settled,
)

pytestmark = pytest.mark.anyio


async def hold_in_task(lock: aiolock.AsyncRLock, lease: float | None = None) -> asyncio.Task[None]:
    """Acquire ``lock`` in a task of its own; the task releases it when cancelled."""
    ready = asyncio.Event()

    async def holder() -> None:
        await lock.lock(lease=lease)
        ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            if lease is None:
                await lock.unlock()

    task = asyncio.create_task(holder())
    await ready.wait()
    return task


async def test_waiter_wakes_promptly_on_release(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("prompt")
    released_at: list[float] = []
    ready = asyncio.Event()
    release_now = asyncio.Event()

    async def holder() -> None:
        await lock.lock()  # the watchdog lease: 30 s left when released
        ready.set()
        await release_now.wait()
        released_at.append(time.perf_counter())
        await lock.unlock()

    holder_task = asyncio.create_task(holder())
    await ready.wait()

    async def waiter() -> float:
        assert await lock.try_lock(wait=20)
        granted = time.perf_counter()
        await lock.unlock()
        return granted

    waiter_task = asyncio.create_task(waiter())
    await eventually(
        lambda: lock.statistics().waiters == 1 and aiolock_client.statistics().subscriptions == 1
    )

    def parked() -> bool:
        entry = entry_of(aiolock_client, lock)
        assert entry is not None  # subscribed: the wait above saw its subscription
        return entry.parked == 1

    await eventually(parked)
    release_now.set()
    granted = await waiter_task
    await holder_task
    gap = granted - released_at[0]
    # Woken by the release message: a few ms here, against 30 s if it had to wait out the lease.
    assert gap < 1.0, gap


async def test_one_subscription_for_many_waiters(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("crowded")
    holder = await hold_in_task(lock)
    acquired: list[int] = []

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            acquired.append(i)

    waiters = [asyncio.create_task(waiter(i)) for i in range(50)]
    # The SUBSCRIBE runs in the background after the first waiter parks: wait for its
    # confirmation (and the tries it brings back), not only for the waiters to park.
    await eventually(lambda: settled(aiolock_client, lock, 50), what="50 waiters settled")
    numsub = dict(await redis.pubsub_numsub(keys_of(lock).channel))
    assert numsub[keys_of(lock).channel] == 1
    assert await channels(redis, aiolock_client) == [keys_of(lock).channel]
    pubsub_clients = [c for c in await redis.client_list() if int(c.get("sub", 0)) > 0]
    assert len(pubsub_clients) == 1
    assert aiolock_client.statistics().subscriptions == 1
    holder.cancel()
    await asyncio.gather(*waiters)
    await asyncio.gather(holder, return_exceptions=True)
    assert sorted(acquired) == list(range(50))
    await assert_clean(redis, aiolock_client)


async def test_one_release_wakes_one_waiter(aiolock_client: aiolock.Client, redis: Redis) -> None:
    """One message, one wake-up: exactly one acquire attempt follows it, not one per waiter."""
    lock = aiolock_client.lock("wake-one")
    keys = keys_of(lock)
    await hold_as_stranger(redis, lock, 30_000)
    entries = entries_of(aiolock_client)
    channel = keys.channel.encode()
    winners: list[int] = []
    done = asyncio.Event()

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            winners.append(i)
            await done.wait()

    waiters = [asyncio.create_task(waiter(i)) for i in range(5)]
    await eventually(lambda: channel in entries and entries[channel].parked == 5)
    before = await evalsha_calls(redis)
    await redis.delete(keys.lock)
    await redis.publish(keys.channel, "released")
    # Woken waiters that failed would have re-parked after trying, so parked == 4 with one
    # winner means every attempt since the message has landed.
    await eventually(lambda: len(winners) == 1 and entries[channel].parked == 4)
    assert await evalsha_calls(redis) - before == 1
    done.set()
    await asyncio.gather(*waiters)  # each release hands the lock to the next waiter
    assert sorted(winners) == list(range(5))
    await assert_clean(redis, aiolock_client)


async def test_wait_is_bounded_by_the_lease_without_a_message(
    aiolock_client: aiolock.Client,
) -> None:
    """A fixed lease expires without a PUBLISH: the waiter retries when the TTL runs out."""
    lock = aiolock_client.lock("expiring")
    holder = await hold_in_task(lock, lease=0.3)
    started = time.perf_counter()
    assert await lock.try_lock(wait=10)
    waited = time.perf_counter() - started
    assert waited < 5, waited
    await lock.unlock()
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


async def test_wait_zero_never_subscribes(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("no-wait")
    holder = await hold_in_task(lock)
    assert not await lock.try_lock(wait=0)
    assert aiolock_client.statistics().subscriptions == 0
    assert not services_of(aiolock_client).pubsub.subscriber_homes  # no subscriber was even made
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)


async def test_waiters_survive_a_killed_pubsub_connection(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("resubscribe")
    release = asyncio.Event()
    ready = asyncio.Event()

    async def holder() -> None:
        await lock.lock()
        ready.set()
        await release.wait()
        await lock.unlock()

    async def acquire_and_release() -> bool:
        acquired = await lock.try_lock(wait=20)
        await lock.unlock()
        return acquired

    holder_task = asyncio.create_task(holder())
    await ready.wait()
    waiter = asyncio.create_task(acquire_and_release())
    await eventually(lambda: aiolock_client.statistics().subscriptions == 1)
    # Settled: the server confirmed the SUBSCRIBE, so it counts the connection as pub/sub.
    await eventually(lambda: settled(aiolock_client, lock))
    reconnects = services_of(aiolock_client).pubsub.statistics().reconnects
    assert await redis.client_kill_filter(_type="pubsub") >= 1
    await eventually(
        lambda: services_of(aiolock_client).pubsub.statistics().reconnects > reconnects
    )

    async def resubscribed() -> bool:
        return await channels(redis, aiolock_client) == [keys_of(lock).channel]

    await eventually(resubscribed)
    release.set()
    assert await asyncio.wait_for(waiter, 5)  # the message reached the new subscription
    await holder_task
    await assert_clean(redis, aiolock_client)


async def test_newcomers_queue_behind_a_task_already_trying(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """Five tasks at once on a busy lock: only the first one asks Redis; the rest queue behind."""
    lock = aiolock_client.lock("queue-behind")
    keys = keys_of(lock)
    await hold_as_stranger(redis, lock, 30_000)
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            served.append(i)

    before = await evalsha_calls(redis)
    waiters = [asyncio.create_task(waiter(i)) for i in range(5)]
    entries = entries_of(aiolock_client)
    key = keys.channel.encode()
    # Confirmed and all parked: the confirmation's wake-up has been used (a woken task is not
    # parked until its try is over).  The first: one try, then one more once subscribed.  The
    # others: none yet.
    await eventually(lambda: key in entries and entries[key].confirmed and entries[key].parked == 5)
    assert await evalsha_calls(redis) - before == 2
    await redis.delete(keys.lock)
    await redis.publish(keys.channel, "released")
    await asyncio.gather(*waiters)  # each release wakes the next in line
    assert served == list(range(5))  # in the order they came
    await assert_clean(redis, aiolock_client)


async def test_a_waiter_leaving_without_the_lock_lets_the_next_try(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A newcomer queued behind a waiter that is then cancelled does not wait a watchdog lease.

    The lock's foreign holder has a short lease and never publishes: the queued newcomer must
    try, learn the TTL and retry when it runs out, long before its 30 s queueing pause.
    """
    lock = aiolock_client.lock("leaving")
    await hold_as_stranger(redis, lock, 1_500)
    first = asyncio.create_task(lock.try_lock(wait=30))
    await eventually(lambda: parked(aiolock_client, lock) == 1)

    async def newcomer() -> bool:
        acquired = await lock.try_lock(wait=30)
        await lock.unlock()
        return acquired

    second = asyncio.create_task(newcomer())
    await eventually(lambda: parked(aiolock_client, lock) == 2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 10)
    await assert_clean(redis, aiolock_client)


async def test_a_task_queued_behind_a_fixed_lease_that_runs_out_is_not_kept_waiting(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """The task ahead is granted a 0.3 s lease and never unlocks: no release is published.

    The queued task parks for up to a watchdog lease (30 s) without a TTL to go by; the end of
    the other hold, which this client times itself, wakes it instead.
    """
    lock = aiolock_client.lock("short-lease-ahead")
    first = asyncio.create_task(lock.lock(lease=0.3))  # its task ends holding the lock
    second = asyncio.create_task(lock.try_lock(wait=20))  # queued behind the first's try
    await first
    assert await asyncio.wait_for(second, 5)
    assert await lock.force_unlock()  # held by the second task, which has ended
    await assert_clean(redis, aiolock_client)
