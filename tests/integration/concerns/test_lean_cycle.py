"""What a fault-free cycle of the plain lock costs on the server, counted by the server itself.

An uncontended acquire + release is 6 commands (``EVALSHA``, ``EXISTS``, ``INCR``, ``HSET``,
``PEXPIRE``; ``HDEL``: the release is a bare command) and publishes nothing; a release
publishes only when a waiter was refused by that incarnation of the lock, and that waiter is
then woken by it.  The release of a hold whose acquire was refused on the way is the script
(``EVALSHA``, ``HMGET``, ``DEL``, and ``PUBLISH`` in the same call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import counted, eventually, keys_of, services_of

pytestmark = pytest.mark.anyio


async def test_an_uncontended_cycle_is_six_commands_and_publishes_nothing(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("lean")

    async def cycles() -> None:
        for _ in range(20):
            await lock.lock()
            await lock.unlock()

    await cycles()  # scripts loaded, connection open
    ran = await counted(redis, cycles)
    assert sum(ran.values()) == 20 * 6, ran
    assert ran == {
        "evalsha": 20,
        "exists": 20,
        "incr": 20,
        "hset": 20,
        "pexpire": 20,
        "hdel": 20,
    }
    assert await redis.keys(f"{aiolock_client.key_prefix}:*") == [
        f"{aiolock_client.key_prefix}:fence"
    ]


async def test_a_fault_free_grant_answers_its_token_alone(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """The fault-free fresh grant answers the fencing token alone, an integer (no table to
    build on the server); the client reads it as count 1 with the lease it asked.  A refusal
    answers ``{pttl}``, a re-entry the whole ``{token, count, pttl}``."""
    lock = aiolock_client.lock("short-answer")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    fresh = lock.attempt_call(owner, services.owners.next_request(), 20_000)
    token = await services.calls.run(*fresh)
    assert isinstance(token, int)
    assert await redis.hget(keys_of(lock).lock, f"f:{owner}") == str(token)
    assert 19_000 < await redis.pttl(keys_of(lock).lock) <= 20_000
    assert lock.grant_of(token, 20_000) == [token, 1, 20_000]
    again = lock.attempt_call(owner, services.owners.next_request(), 20_000)
    assert await services.calls.run(*again) == [token, 2, pytest.approx(20_000, abs=1_000)]
    other = lock.attempt_call("another owner", services.owners.next_request(), 20_000)
    refused = await services.calls.run(*other)
    assert isinstance(refused, list)
    assert len(refused) == 1
    assert 0 < refused[0] <= 20_000
    assert lock.grant_of(refused, 20_000) is None
    for _ in range(2):
        assert (
            await services.calls.run(
                *lock.release_call(owner, services.owners.next_request(), None)
            )
            is not None
        )
    assert not await redis.exists(keys_of(lock).lock)


async def test_a_release_publishes_for_a_waiter_it_refused(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A waiter of another client is refused (it parks on the channel, with the holder's
    whole lease to wait): the release publishes once, and the waiter gets the lock then, not
    at the lease's end."""
    holder = aiolock_client.lock("handed")
    await holder.lock(lease=60)
    other = make_client().lock("handed", owner="waiter")  # released from this task
    waiting = asyncio.create_task(other.try_lock(wait=30))
    stats = services_of(other).pubsub

    async def parked() -> bool:
        return (
            stats.statistics().waiters == 1 and await redis.hget(keys_of(holder).lock, ":w") == "1"
        )

    await eventually(parked, what="the waiter refused and parked")

    async def handed_over() -> None:
        await holder.unlock()  # a plain HDEL, which says a waiter was refused: then a PUBLISH
        assert await asyncio.wait_for(waiting, timeout=10)  # woken by it, not the lease

    ran = await counted(redis, handed_over)
    assert ran.get("publish") == 1, ran
    assert ran.get("hdel") == 1, ran
    await other.unlock()


async def test_a_hold_whose_acquire_was_refused_is_released_by_the_script(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """The lock is contended: its release publishes in the same call (the script), rather
    than after the reply of a plain HDEL, a round trip later."""
    other = make_client().lock("contended", owner="first")
    await other.lock(lease=60)
    lock = aiolock_client.lock("contended", owner="second")  # acquired in a task of its own
    waiting = asyncio.create_task(lock.try_lock(wait=30))
    await eventually(lambda: aiolock_client.statistics().waiters == 1, what="refused and parked")
    await other.unlock()
    assert await asyncio.wait_for(waiting, timeout=10)
    ran = await counted(redis, lock.unlock)
    assert ran.get("evalsha") == 1, ran
    assert "hdel" not in ran, ran
    async with lock.acquire(wait=5):  # uncontended again: the bare command
        pass
    assert not await lock.is_locked()
