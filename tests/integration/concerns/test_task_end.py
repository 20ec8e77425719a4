"""A task that ends (returns, raises or is cancelled) still holding task-owned locks has them
released by the client at once, every reentrant hold, with a warning naming the lock (SPEC,
AsyncRLock); holds of an explicit owner keep the lease rule."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

import aiolock
from tests.helpers import eventually

pytestmark = pytest.mark.anyio

KINDS = ["lock", "fair", "spin", "read", "write"]


def lock_of(client: aiolock.Client, kind: str, owner: str | None = None) -> Any:
    if kind == "lock":
        return client.lock("job", owner=owner)
    if kind == "fair":
        return client.fair_lock("job", owner=owner)
    if kind == "spin":
        return client.spin_lock("job", owner=owner)
    rw = client.rw_lock("job")
    return rw.read_lock(owner=owner) if kind == "read" else rw.write_lock(owner=owner)


def rival_of(client: aiolock.Client, kind: str) -> Any:
    """A lock of another client that ``kind``'s hold keeps out (a writer, for a reader)."""
    return lock_of(client, "write" if kind == "read" else kind)


async def ended(how: str, work: Callable[[], Any]) -> None:
    """Run ``work`` in a task that then ends as ``how`` says, still holding what it took."""
    entered = asyncio.Event()

    async def body() -> None:
        await work()
        if how == "raises":
            raise ValueError("the task's own error")
        if how == "cancelled":
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    if how == "cancelled":
        await entered.wait()
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize(
    "case", [(how, lease) for how in ("returns", "raises", "cancelled") for lease in (None, 600.0)]
)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_task_that_ends_holding_a_lock_has_it_released(
    kind: str,
    case: tuple[str, float | None],
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    caplog: pytest.LogCaptureFixture,
) -> None:
    how, lease = case
    lock = lock_of(aiolock_client, kind)

    async def take() -> None:
        for _ in range(3):  # every reentrant hold goes
            assert await lock.try_lock(lease=lease)

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await ended(how, take)
        # Well within any lease: the client let go of it, the server did not expire it.
        assert await asyncio.wait_for(rival_of(make_client(), kind).try_lock(wait=10), 15)
    assert any(
        "ended holding" in r.getMessage() and "'job'" in r.getMessage() for r in caplog.records
    )
    # The rival may be granted as the last release lands, before its reply is read here.
    await eventually(lambda: aiolock_client.statistics().holds == 0, what="no hold recorded")


async def test_every_part_of_a_multilock_is_released_when_its_task_ends(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    multi = aiolock.MultiLock(aiolock_client.lock("a"), aiolock_client.fair_lock("b"))
    other = make_client()
    taken, done = asyncio.Event(), asyncio.Event()

    async def take() -> None:
        assert await multi.try_lock(lease=600)
        taken.set()
        await done.wait()

    task = asyncio.create_task(take())
    await taken.wait()
    # The parts belong to the calling task while it lives, not to a task of each part's.
    assert not await other.lock("a").try_lock(wait=0)
    assert not await other.fair_lock("b").try_lock(wait=0)
    assert await multi.is_locked()
    done.set()
    await task
    assert await other.lock("a").try_lock(wait=10)
    assert await other.fair_lock("b").try_lock(wait=10)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_explicit_owner_keeps_its_lock_after_the_task_ends(
    kind: str, aiolock_client: aiolock.Client
) -> None:
    lock = lock_of(aiolock_client, kind, owner="job-17")

    async def take() -> None:
        assert await lock.try_lock(lease=600)

    await ended("returns", take)
    assert await lock.is_held()
    assert await lock.remaining_lease() > 500
    await lock.unlock()


async def test_a_lock_released_before_its_task_ends_is_not_released_again(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    caplog: pytest.LogCaptureFixture,
) -> None:
    lock = aiolock_client.lock("job")

    async def cycle() -> None:
        for _ in range(3):
            async with lock.acquire(lease=600):
                pass

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await ended("returns", cycle)
        holder = make_client().lock("job")
        assert await holder.try_lock(lease=600)
        await asyncio.sleep(0)  # the ended task's callbacks run
        await eventually(lambda: not aiolock_client.statistics().pending, what="nothing pending")
    assert await holder.is_held()
    assert not [r for r in caplog.records if "ended holding" in r.getMessage()]


async def test_a_task_that_runs_only_the_acquire_has_it_released_and_is_told_why(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # create_task() (and asyncio.wait_for() on Python 3.11) runs the acquire in a task of its
    # own: the lock is that task's, released when it ends, and the warning says why.
    with caplog.at_level(logging.WARNING, logger="aiolock"):
        assert await asyncio.create_task(aiolock_client.lock("bare").try_lock(lease=600))
        assert await asyncio.wait_for(make_client().lock("bare").try_lock(wait=10), 15)
    warned = [r.getMessage() for r in caplog.records if "ended holding" in r.getMessage()]
    assert any("asyncio.wait_for()" in message and "owner=" in message for message in warned)
