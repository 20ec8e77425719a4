"""AsyncRLock's calls as SPEC.md defines them, against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, eventually, lock_keys

pytestmark = pytest.mark.anyio


async def test_try_lock_and_unlock(aiolock_client: aiolock.Client, redis: Redis) -> None:
    lock = aiolock_client.lock("orders:42")
    assert not await lock.is_locked()
    assert await lock.remaining_lease() is None
    assert await lock.try_lock() is True
    assert await lock.is_locked()
    assert await lock.is_held()
    assert await lock.hold_count() == 1
    lease = await lock.remaining_lease()
    assert lease is not None
    assert 0 < lease <= aiolock_client.watchdog_timeout
    assert await lock_keys(redis, aiolock_client) == [f"{aiolock_client.key_prefix}:{{orders:42}}"]
    await lock.unlock()
    assert not await lock.is_locked()
    assert await lock.hold_count() == 0
    await assert_clean(redis, aiolock_client)


async def test_reentrancy_counts_each_hold(aiolock_client: aiolock.Client, redis: Redis) -> None:
    lock = aiolock_client.lock("reentrant")
    await lock.lock()
    assert await lock.try_lock()
    async with lock.acquire() as guard:
        assert await lock.hold_count() == 3
        assert "held x3" in repr(lock)
        token = guard.fencing_token
    assert await lock.hold_count() == 2
    async with lock as inner:
        assert inner.fencing_token == token  # a reentrant grant shares its holder's token
    await lock.unlock()
    assert await lock.is_locked()  # one hold left: only the last release deletes the key
    await lock.unlock()
    assert not await lock.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    await assert_clean(redis, aiolock_client)


async def test_another_task_is_another_owner(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("owned")
    await lock.lock()

    async def intruder() -> tuple[bool, bool, int]:
        refused = not await lock.try_lock()
        with pytest.raises(aiolock.LockNotOwnedError):
            await lock.unlock()
        return refused, await lock.is_held(), await lock.hold_count()

    assert await asyncio.create_task(intruder()) == (True, False, 0)
    assert await lock.hold_count() == 1  # the failed unlock disturbed nothing
    await lock.unlock()


async def test_the_task_that_runs_lock_is_the_owner(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """``lock()`` is a plain function returning its coroutine; who runs that coroutine owns."""
    lock = aiolock_client.lock("made-here-run-there")
    with pytest.raises(ValueError, match="lease"):
        # Checked at the call, before anything is awaited.
        lock.lock(lease=-1)  # type: ignore[unused-coroutine]
    done = asyncio.Event()

    async def hold(acquiring: Coroutine[Any, Any, object]) -> int:
        assert await acquiring is None
        count = await lock.hold_count()
        await done.wait()
        await lock.unlock()
        return count

    holder = asyncio.create_task(hold(lock.lock()))  # made by this task, run by the holder
    await eventually(lock.is_locked)
    assert (await lock.is_held(), await lock.hold_count()) == (False, 0)
    done.set()
    assert await holder == 1
    await assert_clean(redis, aiolock_client)


async def test_other_client_is_another_owner(
    aiolock_server: object, aiolock_client: aiolock.Client
) -> None:
    other = aiolock.Client(aiolock_client.redis, key_prefix=aiolock_client.key_prefix)
    try:
        await aiolock_client.lock("shared").lock()
        assert not await other.lock("shared").try_lock()
        assert await other.lock("shared").is_locked()
        assert not await other.lock("shared").is_held()
        with pytest.raises(aiolock.LockNotOwnedError):
            await other.lock("shared").unlock()
    finally:
        await other.aclose()
    await aiolock_client.lock("shared").unlock()


async def test_acquire_times_out(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("busy")
    await lock.lock()

    async def contender() -> None:
        with pytest.raises(aiolock.LockTimeoutError, match="busy"):
            async with lock.acquire(wait=0.05):
                pytest.fail("acquired a held lock")
        assert not await lock.try_lock(wait=0)
        assert not await lock.try_lock(wait=0.05)

    await asyncio.create_task(contender())
    await lock.unlock()


async def test_guard_releases_on_error_and_cancellation(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("guarded")
    with pytest.raises(ZeroDivisionError):
        async with lock.acquire():
            1 / 0  # noqa: B018
    assert not await lock.is_locked()

    entered = asyncio.Event()

    async def body() -> None:
        async with lock.acquire():
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_clean(redis, aiolock_client)


async def test_force_unlock(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("forced")
    assert await lock.force_unlock() is False
    await lock.lock()

    async def other() -> bool:
        return await lock.force_unlock()

    assert await asyncio.create_task(other()) is True
    assert not await lock.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()


async def test_force_unlock_wakes_a_waiter(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("forced-wake")
    holder_ready = asyncio.Event()
    forever = asyncio.Event()

    async def holder() -> None:
        await lock.lock()  # watchdog lease: 30 s
        holder_ready.set()
        await forever.wait()

    holder_task = asyncio.create_task(holder())
    await holder_ready.wait()
    waiter = asyncio.create_task(lock.try_lock(wait=10))
    await asyncio.sleep(0)
    assert await lock.force_unlock()
    assert await asyncio.wait_for(waiter, 5)  # woken by the message, not by the 30 s lease
    holder_task.cancel()
    await asyncio.gather(holder_task, return_exceptions=True)


async def test_statistics_and_repr(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("observed")
    assert repr(lock) == "<AsyncRLock 'observed' [unlocked]>"
    stats = lock.statistics()
    assert (stats.name, stats.held, stats.waiters, stats.acquisitions) == ("observed", 0, 0, 0)
    async with lock.acquire() as guard:
        assert repr(guard) == f"<LockGuard 'observed' token={guard.fencing_token} [held]>"
        assert lock.statistics().held == 1
        assert aiolock_client.statistics().holds == 1
        assert repr(lock) == "<AsyncRLock 'observed' [held x1]>"
    assert lock.statistics().acquisitions == 1
    named = aiolock_client.lock("observed", owner="job-1")
    assert repr(named) == "<AsyncRLock 'observed' owner='job-1' [unlocked]>"
    assert repr(aiolock_client).startswith(f"<Client {aiolock_client.id} redis://127.0.0.1:")
    assert repr(aiolock_client).endswith("[open, holds:0, waiters:0, subscriptions:0]>")


async def test_client_id_is_a_uuid4(aiolock_client: aiolock.Client) -> None:
    import uuid

    assert uuid.UUID(aiolock_client.id).version == 4


async def test_closed_client_refuses_work(aiolock_server: object) -> None:
    from aiolock.testing.pytest_plugin import ServerInfo

    assert isinstance(aiolock_server, ServerInfo)
    async with aiolock.Client.from_url(aiolock_server.url, key_prefix="closed-test") as client:
        lock = client.lock("x")
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        await lock.try_lock()


async def test_wraps_an_existing_redis_without_closing_it(aiolock_server: object) -> None:
    from aiolock.testing.pytest_plugin import ServerInfo

    assert isinstance(aiolock_server, ServerInfo)
    redis = Redis.from_url(aiolock_server.url)
    try:
        async with aiolock.Client(redis, key_prefix="wrap-test") as client:
            async with client.lock("w").acquire():
                pass
        assert await redis.ping()  # still usable: the client never closes what it wraps
    finally:
        await redis.aclose()


async def test_names_are_opaque(aiolock_client: aiolock.Client, redis: Redis) -> None:
    names = ["a{b}c", "{", "}", "%7B", "with space", "new\nline", "nul\0byte", "ключ", "x" * 5000]
    for name in names:
        async with aiolock_client.lock(name).acquire(wait=0):
            for other in names:
                assert await aiolock_client.lock(other).is_locked() == (other == name)
    await assert_clean(redis, aiolock_client)
