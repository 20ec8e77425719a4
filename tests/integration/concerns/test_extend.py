"""``guard.extend(lease)`` and ``permit.extend(lease)``: a fixed lease set anew while held, on
every single-name kind and a semaphore's permit; refused on a lost hold, a watched hold, bad
values (before any I/O) and a composite's guard."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import (
    assert_clean,
    evalsha_calls,
    eventually,
    keys_of,
    rw_keys_of,
    stall_server,
)

pytestmark = pytest.mark.anyio

MakeClient = Callable[..., aiolock.Client]

KINDS = ["lock", "fair", "spin", "read", "write", "permit"]


@dataclass
class Held:
    """One hold under test: its guard (or permit), the key whose PTTL is its lease, and how to
    ask the server whether it is still held."""

    guard: Any  # LockGuard or Permit: both have extend(), valid_for() and lost
    key: str
    still_held: Callable[[], Any]
    keys: tuple[str, ...]  # every key the hold lives in


@contextlib.asynccontextmanager
async def held(
    client: aiolock.Client, kind: str, name: str, lease: float | None
) -> AsyncIterator[Held]:
    """``kind`` held under ``name`` with ``lease`` for the block (released by its exit)."""
    if kind == "permit":
        sem = client.semaphore(name, 2)
        async with sem.acquire(wait=5, lease=lease) as permit:

            async def permit_held() -> bool:
                return await client.redis.zscore(keys_of(sem).lock, permit.id) is not None

            key = keys_of(sem).lock
            yield Held(permit, key, permit_held, (key,))
        return
    lock: Any
    if kind == "lock":
        lock = client.lock(name)
    elif kind == "fair":
        lock = client.fair_lock(name)
    elif kind == "spin":
        lock = client.spin_lock(name)
    else:
        rw = client.rw_lock(name)
        lock = rw.read_lock() if kind == "read" else rw.write_lock()
    key = keys_of(lock).lock
    keys = (key, rw_keys_of(lock).readers) if kind in ("read", "write") else (key,)
    async with lock.acquire(wait=5, lease=lease) as guard:
        yield Held(guard, key, lock.is_held, keys)


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_sets_the_lease_anew_and_the_hold_outlives_its_old_lease(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    loop = asyncio.get_running_loop()
    async with held(aiolock_client, kind, "ext", lease=1) as hold:
        started = loop.time()
        await hold.guard.extend(30)
        assert 29_000 < await redis.pttl(hold.key) <= 30_000
        assert 29 < hold.guard.valid_for() <= 30
        # Past the old lease's end (1 s from the grant): still held, on the server too.
        await asyncio.sleep(max(0.0, started + 1.3 - loop.time()))
        assert not hold.guard.lost
        assert await hold.still_held()
        assert 28 < hold.guard.valid_for() <= 30
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_shortens_a_lease_and_the_client_counts_the_shorter(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    with pytest.raises(aiolock.LockLostError):
        async with held(aiolock_client, kind, "short", lease=30) as hold:
            await hold.guard.extend(0.3)
            assert 0 < await redis.pttl(hold.key) <= 300
            assert 0 < hold.guard.valid_for() <= 0.3
            await eventually(lambda: hold.guard.lost, what="the shorter lease ran out")

            async def gone() -> bool:
                return await redis.exists(hold.key) == 0

            await eventually(gone, what="the key gone with the shorter lease")
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_of_a_hold_gone_on_the_server_raises_lock_lost(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """The client did not know yet: the script finds the hold gone, and the guard is lost."""
    with pytest.raises(aiolock.LockLostError):
        async with held(aiolock_client, kind, "gone", lease=30) as hold:
            await redis.delete(*hold.keys)
            with pytest.raises(aiolock.LockLostError, match="no longer held when extend"):
                await hold.guard.extend(10)
            assert hold.guard.lost
            assert hold.guard.valid_for() == 0.0
            assert await redis.exists(hold.key) == 0  # nothing was written
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_after_the_lease_ran_out_raises_lock_lost_without_a_call(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    with pytest.raises(aiolock.LockLostError):
        async with held(aiolock_client, kind, "ran-out", lease=0.1) as hold:
            await eventually(lambda: hold.guard.lost, what="the lease ran out")
            calls = await evalsha_calls(redis)
            with pytest.raises(aiolock.LockLostError, match="no longer held"):
                await hold.guard.extend(10)
            assert await evalsha_calls(redis) == calls
    await assert_clean(redis, aiolock_client)


async def test_extend_checks_the_guards_fencing_token(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A hold of the same owner under another token (a later hold, as the server sees it) is
    not this guard's: nothing changes."""
    lock = aiolock_client.lock("token")
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire(wait=5, lease=30) as guard:
            owner, _ = lock.current_owner()
            await redis.hset(keys_of(lock).lock, f"f:{owner}", guard.fencing_token + 1)
            with pytest.raises(aiolock.LockLostError):
                await guard.extend(60)
            assert await redis.pttl(keys_of(lock).lock) <= 30_000
            await redis.delete(keys_of(lock).lock)
    await assert_clean(redis, aiolock_client)


async def test_extend_sets_the_whole_locks_lease_whatever_the_reentrant_count(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    lock = aiolock_client.lock("reentrant")
    loop = asyncio.get_running_loop()
    async with lock.acquire(wait=5, lease=1) as outer:
        started = loop.time()
        async with lock.acquire(wait=5, lease=1) as inner:
            await inner.extend(20)
            assert await lock.hold_count() == 2
        assert 19_000 < await redis.pttl(keys_of(lock).lock) <= 20_000
        assert 19 < outer.valid_for() <= 20  # one hold, one lease: the outer guard's too
        await asyncio.sleep(max(0.0, started + 1.3 - loop.time()))
        assert await lock.hold_count() == 1
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("kind", KINDS)
async def test_extend_of_a_watched_hold_is_refused(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    async with held(aiolock_client, kind, "watched", lease=None) as hold:
        calls = await evalsha_calls(redis)
        with pytest.raises(ValueError, match="lease=None: the watchdog renews it"):
            await hold.guard.extend(10)
        assert await evalsha_calls(redis) == calls
        assert not hold.guard.lost
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize(
    "case",
    [
        (None, TypeError, "lease must be a number of seconds, not NoneType"),
        (True, TypeError, "lease must be a number of seconds, not bool"),
        ("5", TypeError, "lease must be a number of seconds, not str"),
        (0, ValueError, "lease must be at least 0.001 seconds"),
        (-1, ValueError, "lease must not be negative"),
        (math.nan, ValueError, "lease must be finite"),
        (math.inf, ValueError, "lease must be finite"),
        (2e9, ValueError, "lease must be at most"),
    ],
)
@pytest.mark.parametrize("kind", ["lock", "permit"])
async def test_bad_leases_are_refused_before_any_io(
    aiolock_client: aiolock.Client,
    redis: Redis,
    kind: str,
    case: tuple[object, type[Exception], str],
) -> None:
    lease, error, words = case
    async with held(aiolock_client, kind, "bad", lease=30) as hold:
        calls = await evalsha_calls(redis)
        with pytest.raises(error, match=words):
            await hold.guard.extend(lease)
        assert await evalsha_calls(redis) == calls
        assert 29 < hold.guard.valid_for() <= 30
    await assert_clean(redis, aiolock_client)


async def test_a_composite_guard_has_no_extend(
    aiolock_client: aiolock.Client, make_client: MakeClient, redis: Redis
) -> None:
    both = aiolock.MultiLock(aiolock_client.lock("a"), aiolock_client.lock("b"))
    async with both.acquire(wait=5, lease=10) as guard:
        with pytest.raises(TypeError, match="MultiLock guard has no extend"):
            await guard.extend(20)
        with pytest.raises(ValueError, match="lease must not be negative"):
            await guard.extend(-1)  # the value is checked first, as everywhere
    servers = [make_client(key_prefix=f"{aiolock_client.key_prefix}-{i}") for i in range(3)]
    quorum = aiolock.RedLock(servers, "c")
    async with quorum.acquire(wait=5, lease=10) as guard:
        with pytest.raises(TypeError, match="RedLock guard has no extend"):
            await guard.extend(20)
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("new", [2, 60])
async def test_a_cancelled_extend_leaves_the_client_counting_the_shorter_lease(
    aiolock_client: aiolock.Client, aiolock_server: ServerInfo, redis: Redis, new: float
) -> None:
    """Cancelled in flight, the extend may or may not have landed: the client counts on the
    shorter of the two leases, never on more than the server may have."""
    lock = aiolock_client.lock("cancelled")
    async with lock.acquire(wait=5, lease=5) as guard:
        stalling = asyncio.Event()
        stall = asyncio.create_task(stall_server(aiolock_server.url, 0.5, stalling))
        await stalling.wait()
        extending = asyncio.create_task(guard.extend(new))
        await asyncio.sleep(0)  # the call is on its way, behind the stall
        extending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await extending
        assert 0 < guard.valid_for() <= min(new, 5)
        await stall
        await guard.extend(5)  # and a later extend is counted as usual
        assert 4.5 < guard.valid_for() <= 5
    await assert_clean(redis, aiolock_client)
