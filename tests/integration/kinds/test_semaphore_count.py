"""A semaphore's count is kept with its permits in Redis while anyone holds one: callers that
disagree are refused with both counts, ``set_permits`` changes it for everyone, and it goes
with the last permit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import (
    assert_clean,
    channels,
    counted,
    evalsha_calls,
    eventually,
    keys_of,
)

pytestmark = pytest.mark.anyio

MakeClient = Callable[..., aiolock.Client]


async def live_permits(redis: Redis, sem: aiolock.AsyncSemaphore) -> int:
    """Permits held on the server now (the count's own member is scored below zero)."""
    now_s, now_us = await redis.time()
    return int(await redis.zcount(keys_of(sem).lock, f"({now_s * 1000 + now_us // 1000}", "+inf"))


async def test_a_caller_with_another_count_is_refused_with_both_counts(
    aiolock_client: aiolock.Client, make_client: MakeClient, redis: Redis
) -> None:
    old = aiolock_client.semaphore("deploy", 5)
    new_client = make_client()
    new = new_client.semaphore("deploy", 10)
    permit = await old.try_acquire(lease=30)
    assert permit is not None
    words = (
        "semaphore 'deploy' has 5 permits on the server; this caller asked for 10 "
        r"\(use set_permits\(\) to change it for everyone\)"
    )
    with pytest.raises(ValueError, match=words):
        await new.try_acquire(wait=5)  # refused at once, not after waiting
    with pytest.raises(ValueError, match=words):
        async with new.acquire(wait=5):
            pass
    assert await live_permits(redis, old) == 1  # nothing was granted
    assert new.statistics().held == 0
    assert await new.available() == 4  # by the server's count
    await permit.release()
    # Nobody holds a permit: no count is kept, and the next acquirer's sets it.
    taken = await new.try_acquire(lease=30)
    assert taken is not None
    with pytest.raises(ValueError, match="has 10 permits on the server; this caller asked for 5"):
        await old.try_acquire()
    await taken.release()
    await assert_clean(redis, aiolock_client)
    await assert_clean(redis, new_client)


async def test_a_rolling_raise_admits_exactly_the_new_count(
    aiolock_client: aiolock.Client, make_client: MakeClient, redis: Redis
) -> None:
    """Old processes run with 5, new ones with 10: never more than 10 holders, however the
    deploy interleaves (an own limit per caller admitted up to 15)."""
    old = aiolock_client.semaphore("rolling", 5)
    new_client = make_client()
    new = new_client.semaphore("rolling", 10)
    permits = [await old.try_acquire(lease=30) for _ in range(5)]
    assert None not in permits
    with pytest.raises(ValueError, match="has 5 permits"):
        await new.try_acquire()
    await new.set_permits(10)
    assert new.permits == 10
    more = [await new.try_acquire(lease=30) for _ in range(5)]
    assert None not in more
    assert await new.try_acquire() is None  # ten held: full
    with pytest.raises(ValueError, match="has 10 permits on the server; this caller asked for 5"):
        await old.try_acquire()
    assert await live_permits(redis, new) == 10
    assert await new.available() == 0
    for permit in [*permits, *more]:
        assert permit is not None
        await permit.release()
    await assert_clean(redis, aiolock_client)
    await assert_clean(redis, new_client)


async def test_a_lowered_count_keeps_its_holders_and_admits_nobody_until_under_it(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    sem = aiolock_client.semaphore("lowered", 5)
    permits = [await sem.try_acquire(lease=30) for _ in range(5)]
    await sem.set_permits(3)
    assert sem.permits == 3
    for permit in permits:
        assert permit is not None
        assert not permit.lost
    assert await live_permits(redis, sem) == 5  # nobody was evicted
    assert await sem.available() == 0
    for permit in permits[:2]:
        assert permit is not None
        await permit.release()
        assert await sem.try_acquire() is None  # 4 held, then 3: not under 3 yet
    assert permits[2] is not None
    await permits[2].release()
    assert await sem.available() == 1
    last = await sem.try_acquire(lease=30)  # 2 held: under 3
    assert last is not None
    assert await sem.try_acquire() is None
    for permit in [*permits[3:], last]:
        assert permit is not None
        await permit.release()
    await assert_clean(redis, aiolock_client)


async def test_a_raise_wakes_as_many_waiters_as_it_frees(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """The holders' leases are long: only the raise's wake-ups can admit the waiters soon."""
    sem = aiolock_client.semaphore("raised", 2)
    holders = [await sem.try_acquire(lease=60) for _ in range(2)]
    waiters = [asyncio.create_task(sem.try_acquire(wait=30, lease=60)) for _ in range(3)]
    await eventually(lambda: sem.statistics().waiters == 3, what="three parked")

    async def subscribed() -> bool:  # a message published before the SUBSCRIBE ran is lost
        return await channels(redis, aiolock_client) == [keys_of(sem).channel]

    await eventually(subscribed, what="the channel subscribed on the server")
    await eventually(lambda: sem.statistics().waiters == 3, what="three parked again")
    await sem.set_permits(4)
    await eventually(lambda: sum(task.done() for task in waiters) == 2, what="two admitted")
    assert sem.statistics().waiters == 1
    assert await live_permits(redis, sem) == 4
    assert holders[0] is not None
    await holders[0].release()
    await eventually(lambda: all(task.done() for task in waiters), what="the third admitted")
    for permit in [holders[1], *(task.result() for task in waiters)]:
        assert permit is not None
        await permit.release()
    await assert_clean(redis, aiolock_client)


async def test_the_count_goes_with_the_last_permit(
    aiolock_client: aiolock.Client, make_client: MakeClient, redis: Redis
) -> None:
    """Key hygiene: nothing is left after the last release, after a set_permits while nobody
    holds, nor once the last permit's lease ran out; a new count is then free to take."""
    sem = aiolock_client.semaphore("hygiene", 3)
    permit = await sem.try_acquire(lease=30)
    assert permit is not None
    assert await redis.zscore(keys_of(sem).lock, ":permits") is not None
    await permit.release()
    assert await redis.exists(keys_of(sem).lock) == 0
    await sem.set_permits(7)  # nobody holds: nothing to keep
    assert await redis.exists(keys_of(sem).lock) == 0
    short = await sem.try_acquire(lease=0.2)
    assert short is not None
    await eventually(lambda: short.lost, what="the lease ran out")

    async def gone() -> bool:
        return await redis.exists(keys_of(sem).lock) == 0

    await eventually(gone, what="the set and its count gone with the lease")
    other_client = make_client()
    other = await other_client.semaphore("hygiene", 2).try_acquire(lease=30)
    assert other is not None  # no count outlived the permits
    await other.release()
    await assert_clean(redis, aiolock_client)
    await assert_clean(redis, other_client)


async def test_an_uncontended_cycle_costs_what_it_did_before_the_count(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """The count is read with the permit's own score (ZMSCORE) and written with it (one ZADD);
    the last release deletes the set: 9 commands to take a permit, 6 to give it back."""
    sem = aiolock_client.semaphore("lean", 2)

    async def cycles() -> None:
        for _ in range(10):
            async with sem.acquire(wait=5, lease=10):
                pass

    await cycles()  # scripts loaded, connection open
    ran = await counted(redis, cycles)
    assert sum(ran.values()) == 10 * 15, ran
    assert ran["zmscore"] == ran["zadd"] == ran["del"] == 10, ran
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize(
    ("permits", "error", "words"),
    [
        (0, ValueError, "permits must be at least 1, got 0"),
        (-3, ValueError, "permits must be at least 1, got -3"),
        (10**13, ValueError, "permits must be at most"),
        (True, TypeError, "permits must be an int, not bool"),
        (2.0, TypeError, "permits must be an int, not float"),
        ("3", TypeError, "permits must be an int, not str"),
    ],
)
async def test_set_permits_refuses_bad_counts_before_any_io(
    aiolock_client: aiolock.Client,
    redis: Redis,
    permits: object,
    error: type[Exception],
    words: str,
) -> None:
    sem = aiolock_client.semaphore("bad", 2)
    calls = await evalsha_calls(redis)
    with pytest.raises(error, match=words):
        await sem.set_permits(permits)  # type: ignore[arg-type]
    assert await evalsha_calls(redis) == calls
    assert sem.permits == 2
