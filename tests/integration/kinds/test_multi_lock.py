"""MultiLock: all or nothing over locks of any kinds and clients, against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import assert_clean, eventually, stall_server

pytestmark = pytest.mark.anyio


async def test_holds_every_part_or_none(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    other = make_client()
    a, b = aiolock_client.lock("a"), other.fair_lock("b")
    both = aiolock.MultiLock(a, b)
    async with both.acquire(wait=1) as guard:
        assert guard.fencing_token == (a.caller_hold().token, b.caller_hold().token)
        assert await both.is_locked()
        assert await both.is_held()
        assert await both.hold_count() == 1
        assert both.statistics().held == 1
        assert repr(both) == "<MultiLock 'a+b' [held x1, parts:2]>"

        async def elsewhere() -> bool:
            return await aiolock.MultiLock(aiolock_client.lock("c"), b).try_lock(wait=0.1)

        assert not await asyncio.create_task(elsewhere())  # b is taken: c is given back
        assert not await aiolock_client.lock("c").is_locked()
    assert not await a.is_locked()
    assert not await b.is_locked()
    for client in (aiolock_client, other):
        await assert_clean(redis, client)


async def test_opposite_orders_never_deadlock(aiolock_client: aiolock.Client) -> None:
    a, b = aiolock_client.lock("x"), aiolock_client.spin_lock("y")
    entered = 0

    async def worker(order: tuple[aiolock.AsyncRLock | aiolock.AsyncSpinLock, ...]) -> None:
        nonlocal entered
        for _ in range(10):
            async with aiolock.MultiLock(*order).acquire(wait=10):
                entered += 1
                await asyncio.sleep(0)

    await asyncio.wait_for(
        asyncio.gather(*(worker((a, b) if i % 2 else (b, a)) for i in range(6))), 30
    )
    assert entered == 60


async def test_wait_bounds_the_whole_attempt_and_nothing_stays_taken(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    first, second = aiolock_client.lock("first"), aiolock_client.lock("second")
    holder = asyncio.Event()
    done = asyncio.Event()

    async def hold_second() -> None:
        async with second.acquire():
            holder.set()
            await done.wait()

    task = asyncio.create_task(hold_second())
    await holder.wait()
    multi = aiolock.MultiLock(first, second)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await multi.try_lock(wait=0.3)
    assert loop.time() - started < 1.5

    async def given_back() -> bool:  # once the wait ran out, in the background
        return not await first.is_locked()

    await eventually(given_back, what="the first part given back")
    with pytest.raises(aiolock.LockTimeoutError):
        async with multi.acquire(wait=0.1):
            pass
    done.set()
    await task
    await assert_clean(redis, aiolock_client)


async def test_a_cancelled_attempt_gives_back_what_it_took(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    first, second = aiolock_client.lock("c1"), aiolock_client.lock("c2")
    await aiolock_client.lock("c2", owner="stranger").lock(lease=30)  # another owner's
    attempt = asyncio.create_task(aiolock.MultiLock(first, second).lock())
    await eventually(lambda: second.statistics().waiters == 1, what="waiting for the second")
    assert await first.is_locked()
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    await eventually(lambda: first.statistics().held == 0, what="the first given back")
    assert not await first.is_locked()
    await second.force_unlock()
    await assert_clean(redis, aiolock_client)


async def test_losing_one_part_loses_the_whole_and_releases_the_rest(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    client = make_client(watchdog_timeout=0.3)  # renewals every 0.1 s find the force soon
    a, b = client.lock("la"), client.lock("lb")
    outsider = make_client().lock("lb")
    reached_end = False
    with pytest.raises(aiolock.LockLostError, match="lb"):
        async with aiolock.MultiLock(a, b).acquire(cancel_on_loss=True) as guard:
            assert await outsider.force_unlock()
            await asyncio.sleep(60)  # cancelled by the loss, which the watchdog finds
            reached_end = True
    assert not reached_end
    assert guard.lost
    assert not await a.is_locked()  # the part still held was released on exit
    await assert_clean(redis, client)


async def test_unlock_releases_every_part(aiolock_client: aiolock.Client) -> None:
    a, b = aiolock_client.lock("ua"), aiolock_client.fair_lock("ub")
    multi = aiolock.MultiLock(a, b)
    await multi.lock()
    assert await multi.remaining_lease() is not None
    await multi.unlock()
    assert not await a.is_locked()
    assert not await b.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        await multi.unlock()
    assert await multi.remaining_lease() is None
    assert not await multi.force_unlock()


def test_bad_arguments() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="at least two"):
        aiolock.MultiLock(client.lock("a"))
    with pytest.raises(TypeError, match="locks"):
        aiolock.MultiLock(client.lock("a"), "b")  # type: ignore[arg-type]
    multi = aiolock.MultiLock(client.lock("a"), client.lock("b"))
    with pytest.raises(ValueError, match="lease"):
        multi.lock(lease=0)  # type: ignore[unused-coroutine]
    with pytest.raises(TypeError, match="wait"):
        multi.acquire(wait="1")  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["block", "unlock"])
async def test_a_cancellation_as_the_release_starts_still_releases_every_part(
    aiolock_client: aiolock.Client, redis: Redis, how: str
) -> None:
    """Regression: the parts' releases ran as tasks that the caller's cancellation cancelled
    before their first step, so no release was sent and the parts stayed held for the lease."""
    a, b = aiolock_client.lock("ra", owner="job"), aiolock_client.fair_lock("rb", owner="job")
    multi = aiolock.MultiLock(a, b)
    context = multi.acquire()
    await context.__aenter__()
    exiting: asyncio.Task[object] = asyncio.create_task(
        context.__aexit__(None, None, None) if how == "block" else multi.unlock()
    )
    # The cancellation runs right after the task's first step, which starts the releases (as
    # tasks of their own, queued behind it): as when another task's cancel() comes in the
    # same loop pass.
    asyncio.get_running_loop().call_soon(exiting.cancel)
    with pytest.raises(asyncio.CancelledError):
        await exiting

    async def released() -> bool:
        return not (await a.is_locked() or await b.is_locked())

    await eventually(released, what="both parts released")
    await assert_clean(redis, aiolock_client)


@pytest.mark.parametrize("how", ["try_lock", "acquire"])
async def test_a_part_lost_while_the_next_is_awaited_is_taken_again(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], how: str
) -> None:
    """Regression: the first part's lease ran out while the second was awaited; try_lock
    returned True with the first part lost (acquire() failed with RuntimeError and left the
    second part held)."""
    first, second = aiolock_client.lock("p1"), aiolock_client.lock("p2")  # taken in this order
    blocker = make_client().lock("p2")
    assert await blocker.try_lock(lease=0.6)  # never released: it expires
    multi = aiolock.MultiLock(first, second)
    if how == "try_lock":
        assert await multi.try_lock(wait=5, lease=0.2)
    else:
        await multi.acquire(wait=5, lease=0.2).__aenter__()
    assert first.statistics().losses >= 1  # the first hold ran out while waiting
    assert await multi.is_held()  # both held now, the first one taken again
    await multi.unlock()


async def test_a_stalled_release_cannot_hold_the_caller_past_its_wait(
    aiolock_client: aiolock.Client, aiolock_server: ServerInfo, redis: Redis
) -> None:
    """Regression: once the wait ran out, giving back the parts already taken waited for
    their releases however long the server took (here a 2 s stall for a 0.5 s wait)."""
    first, second = aiolock_client.lock("s1"), aiolock_client.lock("s2")  # taken in this order
    await aiolock_client.lock("s2", owner="stranger").lock(lease=30)  # another owner's
    loop = asyncio.get_running_loop()
    started = loop.time()
    attempt = asyncio.create_task(aiolock.MultiLock(first, second).try_lock(wait=0.5))
    await eventually(lambda: second.statistics().waiters == 1, what="waiting for the second")
    stalling = asyncio.Event()
    stall = asyncio.create_task(stall_server(aiolock_server.url, 2, stalling))
    await stalling.wait()
    assert not await attempt  # the second part timed out; the first one's release stalls
    assert loop.time() - started < 1.2
    await stall

    async def given_back() -> bool:
        return not await first.is_locked()

    await eventually(given_back, what="the first part given back after the stall")
    await second.force_unlock()
    await assert_clean(redis, aiolock_client)
