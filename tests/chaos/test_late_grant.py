"""A grant that reaches its client past its own lease (the request waited on a frozen path,
and the server ran it when the path thawed) is reported lost to its caller, and given back to
the server at once: the lock's key does not stay for a whole lease with no holder (issue 42.8).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import eventually, keys_of

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio

LEASE = 0.3


def lock_of(client: aiolock.Client, kind: str) -> Any:
    # An explicit owner: the acquiring task ends holding it, which must not release it (a
    # task-owned hold would be released then, hiding what this test looks for).
    if kind == "lock":
        return client.lock("late", owner="o")
    if kind == "fair":
        return client.fair_lock("late", owner="o")
    if kind == "spin":
        return client.spin_lock("late", owner="o")
    if kind == "read":
        return client.rw_lock("late").read_lock(owner="o")
    if kind == "write":
        return client.rw_lock("late").write_lock(owner="o")
    assert kind == "semaphore"
    return client.semaphore("late", 1)


async def take(lock: Any) -> Any:
    """One acquisition with a short fixed lease: the guard or permit, kept by the caller."""
    if isinstance(lock, aiolock.AsyncSemaphore):
        permit = await lock.try_acquire(wait=10, lease=LEASE)
        assert permit is not None
        return permit
    assert await lock.try_lock(wait=10, lease=LEASE)
    return None


@pytest.mark.parametrize("kind", ["lock", "fair", "spin", "read", "write", "semaphore"])
async def test_a_grant_past_its_lease_is_given_back_at_once(
    kind: str,
    proxy: FreezableProxy,
    proxied: Callable[..., aiolock.Client],
    aiolock_client: aiolock.Client,
    redis: Redis,
) -> None:
    client = proxied()
    await take(lock_of(client, "lock" if kind != "lock" else "fair"))  # connected and warm
    lock = lock_of(client, kind)
    key = keys_of(lock).lock
    proxy.freeze()
    sent = proxy.next_request(b"EVALSHA")
    taking = asyncio.create_task(take(lock))
    await sent  # the acquire waits on the frozen path
    await asyncio.sleep(LEASE + 0.1)  # the fault: the path stays frozen past the lease
    proxy.thaw()  # the server runs the acquire now, for a whole lease from now
    await taking
    if isinstance(lock, aiolock.AsyncSemaphore):
        assert (await taking).lost
    else:
        assert not await lock.is_held() or lock.statistics().lost

    async def gone() -> bool:
        if isinstance(lock, aiolock.AsyncSemaphore):
            return int(await redis.zcard(key)) == 0
        return int(await redis.exists(key)) == 0

    # Within a round trip of the reply, not at the end of the lease the server counts.
    await eventually(gone, timeout=LEASE / 2, what="the late grant given back")
    assert lock.statistics().lost


async def test_an_extend_answered_after_the_old_lease_keeps_the_hold(
    proxy: FreezableProxy, proxied: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # The server extends the hold at once; its reply comes after the client's count of the
    # old lease ran out.  The reply decides: held, for the new lease (not taken for lost and
    # left on the server with no holder).
    client = proxied()
    async with client.lock("warm").acquire(wait=5, lease=5) as warm:
        await warm.extend(5)  # the extend script is loaded: the next one is one EVALSHA
    lock = client.lock("extended")
    async with lock.acquire(wait=5, lease=LEASE) as guard:
        held = proxy.hold_next_reply(b"EVALSHA")
        extending = asyncio.create_task(guard.extend(10))
        await held.arrived  # the server ran the extend
        await asyncio.sleep(LEASE + 0.1)  # the fault: its reply waits past the old lease
        held.let_go()
        await extending
        assert not guard.lost
        assert guard.valid_for() > 5
        assert int(await redis.pttl(keys_of(lock).lock)) > 5000
    assert not await redis.exists(keys_of(lock).lock)
