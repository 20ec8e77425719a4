"""Semaphore scenarios drawn from what Redisson's RPermitExpirableSemaphore tests exercise.

Each test names the Redisson test it was modelled on; the scenarios are rewritten for our API
(permits given by each caller, ``Permit`` objects, leases in seconds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, eventually

pytestmark = pytest.mark.anyio


async def test_an_expired_permit_goes_to_a_waiter_and_its_release_is_refused(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testExpire, testExpireTryAcquire, testReleaseExpired.
    sem = aiolock_client.semaphore("expiring", 1)
    stale = await sem.try_acquire(wait=0.1, lease=0.5)
    assert stale is not None
    other = make_client().semaphore("expiring", 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):
        taken = await other.try_acquire(wait=None)  # no release: only the lease frees it
    waited = loop.time() - started
    assert taken is not None
    assert 0.35 <= waited < 1.5, waited
    await eventually(lambda: stale.lost, what="the expired permit reported lost")
    with pytest.raises(aiolock.LockNotOwnedError):
        await stale.release()
    assert not taken.lost
    assert await sem.available() == 0  # the refused release gave nothing back
    assert await sem.try_acquire() is None
    await taken.release()
    assert await sem.available() == 1
    await assert_clean(redis, aiolock_client)


async def test_available_counts_expired_permits_back_without_any_release(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    # Redisson: testAvailablePermits, testAcquiredPermits, testNotExistent.
    sem = aiolock_client.semaphore("pool", 2)
    assert await sem.available() == 2  # nothing stored yet: every permit is free

    async def all_free() -> bool:
        return await sem.available() == 2

    first = await sem.try_acquire(lease=0.4)
    second = await sem.try_acquire(lease=0.4)
    assert first is not None
    assert second is not None
    assert await sem.available() == 0
    assert await sem.try_acquire(wait=0.05, lease=0.4) is None
    await eventually(all_free, what="both permits expired")
    await eventually(lambda: first.lost and second.lost, what="both reported lost")
    third = await sem.try_acquire(lease=0.4)
    assert third is not None
    assert await sem.available() == 1
    await eventually(all_free, what="the third permit expired")
    await eventually(lambda: third.lost, what="the third permit reported lost")
    assert sem.statistics().losses == 3
    await assert_clean(redis, aiolock_client)


async def test_try_acquire_waits_as_long_as_it_is_told_and_takes_a_released_permit(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testTryAcquire, testBlockingAcquire.
    sem = aiolock_client.semaphore("timed", 1)
    held = await sem.try_acquire()
    assert held is not None
    other = make_client().semaphore("timed", 1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await other.try_acquire(wait=0.3) is None
    assert 0.3 <= loop.time() - started < 1.3

    async def release_later(permit: aiolock.Permit) -> None:
        await asyncio.sleep(0.3)  # how long the holder keeps it
        await permit.release()  # from a task that did not acquire it

    releasing = asyncio.create_task(release_later(held))
    started = loop.time()
    taken = await other.try_acquire(wait=5)
    waited = loop.time() - started
    await releasing
    assert taken is not None
    assert 0.25 <= waited < 1.0, waited  # woken by the release, long before the wait ran out
    assert await sem.available() == 0
    assert await sem.try_acquire() is None

    releasing = asyncio.create_task(release_later(taken))
    async with asyncio.timeout(5):
        last = await sem.try_acquire(wait=None)  # waits as long as it takes
    await releasing
    assert last is not None
    assert await other.try_acquire() is None
    await last.release()
    assert await sem.available() == 1


async def test_permits_are_released_one_by_one_in_any_order_and_only_once(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testRelease, testBlockingAcquireMany, testTryReleaseManyExpired.
    sem = aiolock_client.semaphore("batch", 10)
    permits = [await sem.try_acquire() for _ in range(6)]
    taken = [permit for permit in permits if permit is not None]
    assert len(taken) == 6
    assert len({permit.id for permit in taken}) == 6
    assert await sem.available() == 4
    released_by = make_client()  # the ids mean nothing to another client: Permit objects do
    assert await released_by.semaphore("batch", 10).available() == 4
    await asyncio.gather(*(permit.release() for permit in taken[3::-1]))  # 4, other tasks
    assert await sem.available() == 8
    await taken[5].release()
    await taken[4].release()
    assert await sem.available() == 10
    for permit in taken:
        with pytest.raises(aiolock.LockNotOwnedError):
            await permit.release()
    assert await sem.available() == 10

    timed = [await sem.try_acquire(lease=0.3) for _ in range(3)]
    watched = [await sem.try_acquire() for _ in range(3)]
    assert await sem.available() == 4
    await eventually(lambda: all(p is not None and p.lost for p in timed), what="timed expired")

    # The client marks a lease lost at a lower bound of its end: the server may keep the
    # permit a moment longer, and a release meanwhile would still find it.
    async def expired_on_the_server() -> bool:
        return await sem.available() == 7

    await eventually(expired_on_the_server, what="the timed permits expired on the server")
    for live in watched:
        assert live is not None
        assert not live.lost
        await live.release()
    for expired in timed:
        assert expired is not None
        with pytest.raises(aiolock.LockNotOwnedError):
            await expired.release()
    assert await sem.available() == 10
    await assert_clean(redis, aiolock_client)


async def test_a_one_permit_semaphore_loses_no_update_among_tasks_of_four_clients(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testConcurrency_SingleInstance, testConcurrencyLoop_MultiInstance.
    clients = [aiolock_client, make_client(), make_client(), make_client()]
    counter = 0

    async def increment() -> None:
        nonlocal counter
        value = counter
        await asyncio.sleep(0.001)  # another holder would overwrite this update
        counter = value + 1

    async def worker(i: int) -> None:
        sem = clients[i % 4].semaphore("mutex", 1)
        for round_ in range(8):
            if (i + round_) % 2:
                async with sem.acquire(wait=30):
                    await increment()
            else:
                permit = await sem.try_acquire(wait=30)
                assert permit is not None
                try:
                    await increment()
                finally:
                    await permit.release()

    await asyncio.gather(*(worker(i) for i in range(16)))
    assert counter == 16 * 8
    assert await aiolock_client.semaphore("mutex", 1).available() == 1
    for client in clients:
        await assert_clean(redis, client)
