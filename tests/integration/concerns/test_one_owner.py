"""Calls that name the same owner are one owner, for every kind that takes ``owner=`` (SPEC,
AsyncRLock): while it holds the lock another of its calls is a reentrant grant at once, and
when several of its calls wait, each one is woken (by the hand-off, by the owner's own grant,
and by the client closing)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import aiolock
from tests.helpers import eventually

pytestmark = pytest.mark.anyio

OWNER = "job-owner"
KINDS = ["lock", "fair", "spin", "write", "read"]


def lock_of(client: aiolock.Client, kind: str, owner: str | None) -> Any:
    if kind == "lock":
        return client.lock("job", owner=owner)
    if kind == "fair":
        return client.fair_lock("job", owner=owner)
    if kind == "spin":
        return client.spin_lock("job", owner=owner)
    if kind == "write":
        return client.rw_lock("job").write_lock(owner=owner)
    assert kind == "read"
    return client.rw_lock("job").read_lock(owner=owner)


def blocker_of(client: aiolock.Client, kind: str) -> Any:
    """A lock of another client that keeps ``kind``'s lock from ``OWNER`` (readers wait for a
    writer)."""
    return lock_of(client, "write" if kind == "read" else kind, None)


async def two_waiting(
    kind: str, client: aiolock.Client, blocker: Any
) -> tuple[Any, list[asyncio.Task[bool]]]:
    assert await blocker.try_lock(lease=30)
    mine = lock_of(client, kind, OWNER)
    calls = [asyncio.create_task(lock_of(client, kind, OWNER).try_lock(wait=30)) for _ in range(2)]
    await eventually(lambda: mine.statistics().waiters == 2, what="both calls waiting")
    return mine, calls


@pytest.mark.parametrize("kind", KINDS)
async def test_two_waiting_calls_of_one_owner_are_both_granted(
    kind: str, aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    blocker = blocker_of(make_client(), kind)
    mine, calls = await two_waiting(kind, aiolock_client, blocker)
    await blocker.unlock()

    assert await asyncio.wait_for(asyncio.gather(*calls), 20) == [True, True]
    assert await mine.hold_count() == 2
    await mine.unlock()
    assert await mine.is_held()
    await mine.unlock()
    assert not await mine.is_locked()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_of_an_owner_that_holds_is_granted_at_once(
    kind: str, aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    mine = lock_of(aiolock_client, kind, OWNER)
    assert await mine.try_lock(lease=30)
    # Another client waits too: the owner's second call does not queue behind it.
    stranger = blocker_of(make_client(), kind)
    other = asyncio.create_task(stranger.try_lock(wait=30))
    await eventually(lambda: stranger.statistics().waiters == 1, what="the other waiting")
    second = lock_of(aiolock_client, kind, OWNER)
    assert await asyncio.wait_for(second.try_lock(wait=30), 10)
    assert await mine.hold_count() == 2
    await mine.unlock()
    await mine.unlock()
    assert await asyncio.wait_for(other, 20)


@pytest.mark.parametrize("kind", ["lock", "fair"])
async def test_every_waiting_call_of_an_owner_ends_when_its_client_closes(
    kind: str, aiolock_server: Any, make_client: Callable[..., aiolock.Client]
) -> None:
    client = aiolock.Client.from_url(aiolock_server.url)
    blocker = blocker_of(make_client(key_prefix=client.key_prefix), kind)
    try:
        _, calls = await two_waiting(kind, client, blocker)
    finally:
        await client.aclose()
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
    assert all(result is not True for result in results), results
    await blocker.unlock()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_that_gives_up_leaves_the_owners_other_call_waiting(
    kind: str, aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    blocker = blocker_of(make_client(), kind)
    mine, calls = await two_waiting(kind, aiolock_client, blocker)
    calls[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await calls[0]
    await eventually(lambda: mine.statistics().waiters == 1, what="one call left waiting")
    await blocker.unlock()
    assert await asyncio.wait_for(calls[1], 20)
    assert await mine.hold_count() == 1
    await mine.unlock()
    assert not await mine.is_locked()
