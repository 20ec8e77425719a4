"""AsyncSemaphore with leased permits, across clients, against a real server."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, eventually, keys_of, services_of

pytestmark = pytest.mark.anyio


async def test_exactly_permits_at_peak_among_30_tasks_of_3_clients(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client(), make_client()]
    inside = peak = served = 0

    async def worker(i: int) -> None:
        nonlocal inside, peak, served
        async with clients[i % 3].semaphore("downstream", 5).acquire(wait=30) as permit:
            assert not permit.lost
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.01)
            inside -= 1
            served += 1

    await asyncio.gather(*(worker(i) for i in range(30)))
    assert (peak, served) == (5, 30)
    assert await aiolock_client.semaphore("downstream", 5).available() == 5
    for client in clients:
        await assert_clean(redis, client)


async def test_try_acquire_release_and_available(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    sem = aiolock_client.semaphore("pool", 2)
    first = await sem.try_acquire()
    second = await sem.try_acquire()
    assert first is not None
    assert second is not None
    assert first.id != second.id
    assert await sem.available() == 0
    assert await sem.try_acquire() is None
    assert await sem.try_acquire(wait=0.1) is None
    assert repr(sem) == "<AsyncSemaphore 'pool' [held:2/2]>"
    await asyncio.create_task(first.release())  # any task may release a permit
    assert await sem.available() == 1
    with pytest.raises(aiolock.LockNotOwnedError):
        await first.release()
    with pytest.raises(ValueError, match="has 2 permits on the server; this caller asked for 1"):
        async with aiolock_client.semaphore("pool", 1).acquire(wait=0.1):
            pass  # the count is kept with the permits: a caller that disagrees is refused
    await second.release()
    await assert_clean(redis, aiolock_client)


async def test_a_release_wakes_a_waiter_of_another_client(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    holder = await aiolock_client.semaphore("one", 1).try_acquire()
    assert holder is not None
    other = make_client().semaphore("one", 1)
    waiter = asyncio.create_task(other.try_acquire(wait=10))
    await eventually(lambda: other.statistics().waiters == 1, what="parked")
    loop = asyncio.get_running_loop()
    released = loop.time()
    await holder.release()
    permit = await waiter
    assert permit is not None
    assert loop.time() - released < 1  # woken by the release, not by a lease running out
    await permit.release()


async def test_expired_permits_come_back_without_a_release(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    sem = aiolock_client.semaphore("crashy", 1)
    with pytest.raises(aiolock.LockLostError):
        async with sem.acquire(lease=0.3) as permit:
            # A waiter of another client: nothing will be published, the lease ends.
            other = make_client().semaphore("crashy", 1)
            loop = asyncio.get_running_loop()
            started = loop.time()
            taken = await other.try_acquire(wait=5)
            assert taken is not None
            assert loop.time() - started < 1.5  # within the earliest permit's lease
            await eventually(lambda: permit.lost, what="the lost permit reported")
    assert taken is not None
    await taken.release()
    await assert_clean(redis, aiolock_client)


async def test_the_set_goes_with_the_last_lease_after_a_renewed_permit_is_released(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # A watchdog's renewal keeps the set alive for its own lease; once that permit is given
    # back while a short-leased one is still held, the set must not outlive the short lease.
    client = make_client(watchdog_timeout=30)
    sem = client.semaphore("mixed", 2)
    watched = await sem.try_acquire()
    timed = await sem.try_acquire(lease=0.4)
    assert watched is not None
    assert timed is not None
    key = keys_of(sem).lock
    assert await redis.pttl(key) > 20_000
    await watched.release()
    assert 0 < await redis.pttl(key) <= 400
    await eventually(lambda: timed.lost, what="the short lease ran out")

    async def gone() -> bool:
        return await redis.exists(key) == 0

    await eventually(gone, what="the set gone with it")


async def test_the_watchdog_renews_a_permit_while_its_task_lives(
    make_client: Callable[..., aiolock.Client],
) -> None:
    client = make_client(watchdog_timeout=0.3)
    sem = client.semaphore("long", 1)
    async with sem.acquire() as permit:
        await eventually(lambda: sem.statistics().renewals >= 3, what="three renewals")
        assert not permit.lost
        assert await sem.available() == 0


async def test_cancellations_never_leak_a_permit(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client()]
    rng = random.Random(3)

    async def worker(i: int) -> None:
        async with clients[i % 2].semaphore("storm", 3).acquire(wait=10):
            await asyncio.sleep(0.003)

    for _ in range(4):
        tasks = [asyncio.create_task(worker(i)) for i in range(20)]
        for task in rng.sample(tasks, 10):
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for client in clients:
        await assert_clean(redis, client)
    assert await aiolock_client.semaphore("storm", 3).available() == 3


async def test_bad_arguments_fail_before_any_io() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(ValueError, match="permits"):
            client.semaphore("x", 0)
        with pytest.raises(TypeError, match="permits"):
            client.semaphore("x", 2.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="name"):
            client.semaphore(b"x", 2)  # type: ignore[arg-type]
        sem = client.semaphore("x", 2)
        with pytest.raises(ValueError, match="lease"):
            await sem.try_acquire(lease=0)
        with pytest.raises(ValueError, match="wait"):
            sem.acquire(wait=-1)
    finally:
        await client.aclose()


async def test_resent_calls_apply_once(aiolock_client: aiolock.Client) -> None:
    from aiolock import _scripts

    sem = aiolock_client.semaphore("resent", 1)
    keys = keys_of(sem)
    calls = services_of(aiolock_client).calls
    acquire = (keys.lock, keys.meta)
    release = (keys.lock, keys.meta, keys.channel)
    first = await calls.run(_scripts.SEMAPHORE_ACQUIRE, acquire, (30000, "p1", 1, 1))
    again = await calls.run(_scripts.SEMAPHORE_ACQUIRE, acquire, (30000, "p1", 1, 1))
    assert first[:2] == again[:2] == [0, 1]  # the same grant, not a second permit
    assert await sem.available() == 0
    assert await calls.run(_scripts.SEMAPHORE_RELEASE, release, ("p1", 2)) == 0
    # A resend of that release finds the permit gone (no marker outlives it): its client,
    # which knows it resent, takes that for released.
    assert await calls.run(_scripts.SEMAPHORE_RELEASE, release, ("p1", 2)) is None
    assert await calls.run(_scripts.SEMAPHORE_RELEASE, release, ("p1", 3)) is None  # not held
    assert await sem.available() == 1
