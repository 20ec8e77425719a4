"""Keys that outlive their locks do not pile up with the number of names used.

Per-entity names (``orders:{id}``) are the common case: once every lock is released, what is
left under the key prefix is the one fencing counter, plus resend markers that expire within a
lease (or a minute, for an acquire undone before it arrived).  Fencing tokens still strictly
increase per name across expiry, ``force_unlock`` and a restart with persistence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.embedded import EmbeddedServer
from aiolock.pytest_plugin import ServerInfo
from tests.helpers import eventually

pytestmark = pytest.mark.anyio

NAMES = 10_000


async def keys_under(redis: Redis, prefix: str) -> list[str]:
    return sorted([str(key) async for key in redis.scan_iter(match=f"{prefix}:*", count=1000)])


async def in_batches(names: list[str], each: Callable[[str], object], size: int = 100) -> None:
    for start in range(0, len(names), size):
        await asyncio.gather(*(each(name) for name in names[start : start + size]))  # type: ignore[misc]


async def test_ten_thousand_names_leave_one_key(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    prefix = aiolock_client.key_prefix
    tokens: list[int] = []

    async def use(name: str) -> None:
        lock = aiolock_client.lock(name)
        async with lock.acquire(wait=0, lease=1.0) as guard:
            tokens.append(guard.fencing_token)

    await in_batches([f"orders:{i}" for i in range(NAMES)], use)
    assert len(tokens) == NAMES
    assert len(set(tokens)) == NAMES  # one counter: every grant has a token of its own
    left = await keys_under(redis, prefix)
    assert f"{prefix}:fence" in left
    # The release markers live as long as the lease their lock had left: about a second here.
    assert all(key.endswith(":meta") for key in left if key != f"{prefix}:fence")

    async def only_the_counter() -> bool:
        return await keys_under(redis, prefix) == [f"{prefix}:fence"]

    await eventually(only_the_counter, timeout=5.0, what="only the fencing counter left")
    assert await redis.ttl(f"{prefix}:fence") == -1  # it never expires


@pytest.mark.parametrize("kind", ["fair", "write", "read", "spin", "semaphore", "latch"])
async def test_every_kind_leaves_no_key_per_name(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    prefix = aiolock_client.key_prefix

    async def use(name: str) -> None:
        if kind == "semaphore":
            async with aiolock_client.semaphore(name, 2).acquire(wait=0, lease=1.0):
                pass
        elif kind == "latch":
            latch = aiolock_client.countdown_latch(name)
            await latch.try_set_count(1)
            await latch.count_down()
        else:
            lock: aiolock.AsyncRLock | aiolock.AsyncFairLock | aiolock.AsyncSpinLock
            lock = {
                "fair": aiolock_client.fair_lock,
                "spin": aiolock_client.spin_lock,
                "write": lambda n: aiolock_client.rw_lock(n).write_lock(),
                "read": lambda n: aiolock_client.rw_lock(n).read_lock(),
            }[kind](name)
            async with lock.acquire(wait=0, lease=1.0):
                pass

    await in_batches([f"{kind}:{i}" for i in range(500)], use)

    async def only_the_counter() -> bool:
        return set(await keys_under(redis, prefix)) <= {f"{prefix}:fence"}

    await eventually(only_the_counter, timeout=5.0, what=f"no {kind} key per name left")


async def test_tokens_increase_across_expiry_and_force_unlock(
    aiolock_client: aiolock.Client,
) -> None:
    lock = aiolock_client.lock("fenced")
    other = aiolock_client.lock("fenced", owner="other")
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire(wait=0, lease=0.05) as guard:
            first = guard.fencing_token

            async def expired() -> bool:
                return not await lock.is_locked()

            await eventually(expired, what="the lease ended")
    with pytest.raises(aiolock.LockLostError):
        async with other.acquire(wait=0, lease=5) as guard:
            after_expiry = guard.fencing_token
            assert await other.force_unlock()
    async with other.acquire(wait=0, lease=5) as guard:
        after_force = guard.fencing_token
    assert first < after_expiry < after_force


async def test_tokens_increase_across_a_restart_with_persistence(
    aiolock_server: ServerInfo, request: pytest.FixtureRequest
) -> None:
    binary = request.node.callspec.params["aiolock_server"]  # a server of the same binary
    config = {"appendonly": "yes", "appendfsync": "always"}
    with EmbeddedServer(binary=binary, config=config) as server:
        async with aiolock.Client.from_url(server.url) as client:
            async with client.lock("durable").acquire(wait=0, lease=5) as guard:
                before = guard.fencing_token
        await asyncio.to_thread(server.restart)
        async with aiolock.Client.from_url(server.url) as client:
            async with client.lock("durable").acquire(wait=0, lease=5) as guard:
                after = guard.fencing_token
    assert after > before
