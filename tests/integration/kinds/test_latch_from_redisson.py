"""Countdown latch scenarios drawn from what Redisson's RCountDownLatch tests exercise.

Each test names the Redisson test it was modelled on; the scenarios are rewritten for our API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, entry_of, eventually

pytestmark = pytest.mark.anyio


def parked(client: aiolock.Client, latch: aiolock.AsyncCountDownLatch, tasks: int) -> bool:
    """``tasks`` of ``client`` wait on ``latch`` on a confirmed subscription."""
    entry = entry_of(client, latch)
    return entry is not None and entry.confirmed and entry.parked == tasks


async def test_a_wait_with_a_timeout_returns_true_as_soon_as_the_count_reaches_zero(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testAwaitTimeout.
    latch = aiolock_client.countdown_latch("soon")
    assert await latch.try_set_count(1)
    other = make_client().countdown_latch("soon")

    async def count_down_later() -> None:
        await asyncio.sleep(0.3)  # the work that the latch waits for
        await other.count_down()

    counting = asyncio.create_task(count_down_later())
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await latch.count() == 1
    assert await latch.wait(timeout=5)
    waited = loop.time() - started
    await counting
    assert 0.25 <= waited < 1.0, waited  # woken at zero, long before the timeout
    assert await latch.count() == 0
    await assert_clean(redis, aiolock_client)


async def test_a_waiter_that_times_out_or_is_cancelled_leaves_the_others_waiting(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testAwaitTimeoutFail, testMultiAwait.
    other_client = make_client()
    latch = aiolock_client.countdown_latch("gate")
    other = other_client.countdown_latch("gate")
    assert await latch.try_set_count(1)
    short = asyncio.create_task(latch.wait(timeout=0.3))
    long = [asyncio.create_task(latch.wait(timeout=10)) for _ in range(2)]
    long += [asyncio.create_task(other.wait(timeout=10)) for _ in range(2)]
    doomed = asyncio.create_task(other.wait())
    await eventually(
        lambda: parked(aiolock_client, latch, 3) and parked(other_client, latch, 3),
        what="every waiter parked",
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await short
    assert loop.time() - started < 1.3
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    await eventually(
        lambda: parked(aiolock_client, latch, 2) and parked(other_client, latch, 2),
        what="the two that left are gone, the others still parked",
    )
    assert await latch.count() == 1
    assert not any(waiter.done() for waiter in long)
    await make_client().countdown_latch("gate").count_down()
    assert await asyncio.wait_for(asyncio.gather(*long), 5) == [True] * 4
    for client in (aiolock_client, other_client):
        await assert_clean(redis, client)


async def test_count_downs_of_many_tasks_and_clients_at_once_count_exactly(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: RedissonCountDownLatchConcurrentTest.testSingleCountDownAwait_SingleInstance.
    clients = [aiolock_client, make_client(), make_client()]
    parts = 30
    assert await aiolock_client.countdown_latch("parts").try_set_count(parts)
    started_count_downs = 0
    seen_at_wake: list[int] = []

    async def waiter(client: aiolock.Client) -> bool:
        latch = client.countdown_latch("parts")
        done = await latch.wait(timeout=10)
        seen_at_wake.append(started_count_downs)
        assert await latch.count() == 0
        return done

    async def part(client: aiolock.Client) -> None:
        nonlocal started_count_downs
        started_count_downs += 1
        await client.countdown_latch("parts").count_down()

    waiters = [asyncio.create_task(waiter(client)) for client in clients * 4]
    latch = aiolock_client.countdown_latch("parts")
    await eventually(
        lambda: all(parked(client, latch, 4) for client in clients), what="every waiter parked"
    )
    await asyncio.gather(*(part(clients[i % 3]) for i in range(parts - 1)))
    assert await latch.count() == 1  # every count down counted once
    assert not any(task.done() for task in waiters)
    await part(clients[2])
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True] * 12
    assert seen_at_wake == [parts] * 12  # nobody woke before the last part counted down
    for client in clients:
        await assert_clean(redis, client)


async def test_one_of_many_concurrent_try_set_counts_wins(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testTrySetCount, across tasks and clients.
    clients = [aiolock_client, make_client(), make_client()]
    results = await asyncio.gather(
        *(clients[n % 3].countdown_latch("race").try_set_count(n) for n in range(1, 13))
    )
    assert sum(results) == 1
    winner = results.index(True) + 1
    for client in clients:
        assert await client.countdown_latch("race").count() == winner
        assert not await client.countdown_latch("race").try_set_count(99)


async def test_a_latch_opens_unset_and_is_set_again_after_reaching_zero(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testCountDown (latches never set, counted down past zero, set again).
    latch = aiolock_client.countdown_latch("rounds")
    other = make_client().countdown_latch("rounds")
    await latch.count_down()  # never set: nothing to count, nothing stored
    assert await latch.count() == 0
    assert await redis.keys(f"{aiolock_client.key_prefix}:*") == []
    async with asyncio.timeout(1):
        assert await latch.wait()  # no timeout, yet it returns at once: the latch is open
    assert await latch.try_set_count(1)
    await other.count_down()
    assert await latch.wait(timeout=0)

    assert await other.try_set_count(2)  # a second round, set by another client
    assert not await latch.try_set_count(3)
    assert await latch.count() == 2
    assert not await latch.wait(timeout=0.1)
    waiting = asyncio.create_task(latch.wait(timeout=10))
    await eventually(lambda: parked(aiolock_client, latch, 1), what="the waiter parked")
    await other.count_down()
    assert await latch.count() == 1
    assert not waiting.done()
    await other.count_down()
    assert await asyncio.wait_for(waiting, 5)
    assert await other.count() == 0
    await assert_clean(redis, aiolock_client)


async def test_a_waiter_cancelled_at_any_point_of_its_wait_leaves(
    aiolock_client: aiolock.Client,
) -> None:
    """Cancelled while it looks at the count, parks, or looks again, the waiter ends with
    CancelledError: no call on its way may swallow the cancellation (redis-py's command path
    did, on Python 3.11, and the waiter parked again, for good)."""
    latch = aiolock_client.countdown_latch("cancelled-anywhere")
    assert await latch.try_set_count(1)
    for step in range(60):
        waiter = asyncio.create_task(latch.wait())
        for _ in range(step % 12):  # the cancellation lands at a different await each time
            await asyncio.sleep(0)
        waiter.cancel()
        done, _ = await asyncio.wait([waiter], timeout=5)
        assert done, f"the waiter cancelled after {step % 12} loop passes did not end"
        assert waiter.cancelled()
    assert aiolock_client.statistics().waiters == 0
    await latch.count_down()
