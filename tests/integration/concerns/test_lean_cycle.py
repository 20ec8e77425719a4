"""What a fault-free cycle of the plain lock costs on the server, counted by the server itself.

An uncontended acquire + release is 8 commands (``EVALSHA``, ``EXISTS``, ``INCR``, ``HSET``,
``PEXPIRE``; ``EVALSHA``, ``HMGET``, ``DEL``) and publishes nothing; a release publishes only
when a waiter was refused by that incarnation of the lock, and that waiter is then woken by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import eventually, keys_of, services_of

pytestmark = pytest.mark.anyio


async def command_calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


async def counted(redis: Redis, work: Callable[[], object]) -> dict[str, int]:
    """The commands the server ran for ``work()`` (the probe's own INFO left out)."""
    before = await command_calls(redis)
    await work()  # type: ignore[misc]
    after = await command_calls(redis)
    delta = {name: calls - before.get(name, 0) for name, calls in after.items()}
    delta["info"] -= 1
    return {name: calls for name, calls in delta.items() if calls}


async def test_an_uncontended_cycle_is_eight_commands_and_publishes_nothing(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("lean")

    async def cycles() -> None:
        for _ in range(20):
            await lock.lock()
            await lock.unlock()

    await cycles()  # scripts loaded, connection open
    ran = await counted(redis, cycles)
    assert sum(ran.values()) == 20 * 8, ran
    assert ran == {
        "evalsha": 40,
        "exists": 20,
        "incr": 20,
        "hset": 20,
        "pexpire": 20,
        "hmget": 20,
        "del": 20,
    }
    assert await redis.keys(f"{aiolock_client.key_prefix}:*") == [
        f"{aiolock_client.key_prefix}:fence"
    ]


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
    ran = await counted(redis, holder.unlock)
    assert ran.get("publish") == 1, ran
    assert await asyncio.wait_for(waiting, timeout=10)  # woken by the message, not the lease
    await other.unlock()
