"""Leases: expiry, the watchdog, fencing tokens, loss detection, explicit owners."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import _scripts
from aiolock._redis import wire
from tests.helpers import assert_clean, eventually, services_of

pytestmark = pytest.mark.anyio

MakeClient = Callable[..., aiolock.Client]


async def test_fixed_lease_expires(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("short")
    assert await lock.try_lock(lease=0.2)
    lease = await lock.remaining_lease()
    assert lease is not None
    assert lease <= 0.2

    async def is_gone() -> bool:
        return not await lock.is_locked()

    await eventually(is_gone, what="the lease ran out")
    assert lock.statistics().lost
    assert lock.statistics().losses == 1


async def test_reentry_never_shortens_the_lease(aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("keep-long")
    await lock.lock(lease=30)
    await lock.lock(lease=0.05)
    lease = await lock.remaining_lease()
    assert lease is not None
    assert lease > 25
    await lock.unlock()
    await lock.unlock()


async def test_watchdog_keeps_the_lock_alive(make_client: MakeClient, redis: Redis) -> None:
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock("long-job")
    async with lock.acquire() as guard:
        await eventually(lambda: lock.statistics().renewals >= 4, what="4 renewals")
        # More than 4 periods (> 1 lease) later the lock is still ours and alive.
        assert await lock.is_held()
        assert not guard.lost
        remaining = await lock.remaining_lease()
        assert remaining is not None
        assert 0 < remaining <= 0.3
    assert not await lock.is_locked()
    # After the last release the watchdog has nothing left to renew.
    assert services_of(client).holds.watched() == []


async def test_force_unlock_is_noticed_within_one_period(make_client: MakeClient) -> None:
    holder_client = make_client(watchdog_timeout=0.6)
    other = make_client()
    lock = holder_client.lock("taken")
    loop = asyncio.get_running_loop()
    with pytest.raises(aiolock.LockLostError, match="taken"):
        async with lock.acquire(wait=0) as guard:
            lost = asyncio.Event()
            lock.caller_hold().listeners.append(lost.set)  # the guard's hold
            forced_at = loop.time()
            assert await other.lock("taken").force_unlock()
            await asyncio.wait_for(lost.wait(), timeout=2)
            noticed = loop.time() - forced_at
            assert guard.lost
    assert noticed <= services_of(holder_client).watchdog.period + 0.2, noticed
    assert lock.statistics().losses == 1
    assert lock.statistics().lost
    assert "lost" in repr(lock)


async def test_own_force_unlock_marks_the_guard_lost_at_once(
    aiolock_client: aiolock.Client,
) -> None:
    lock = aiolock_client.lock("self-forced")
    with pytest.raises(aiolock.LockLostError, match="force-unlocked"):
        async with lock.acquire() as guard:
            assert await lock.force_unlock()
            assert guard.lost
            assert repr(guard).endswith("[lost]>")


async def test_short_lease_running_out_marks_the_guard_lost(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    holder = make_client()
    successor = make_client()
    lock = holder.lock("runs-out")
    next_owner = successor.lock("runs-out")
    with caplog.at_level(logging.WARNING, logger="aiolock.lock"):
        with pytest.raises(aiolock.LockLostError, match="lease ran out"):
            async with lock.acquire(lease=0.2) as guard:
                # The successor gets the lock as soon as the lease runs out (TTL-bounded wait).
                assert await next_owner.try_lock(wait=5)
                assert guard.lost
    # Leaving the lost block did not release the successor's lock.
    assert await next_owner.is_held()
    assert await next_owner.hold_count() == 1
    await next_owner.unlock()
    lost_logs = [
        r for r in caplog.records if "lost" in r.getMessage() and "runs-out" in r.getMessage()
    ]
    assert len(lost_logs) == 1  # said once


@pytest.mark.parametrize("kind", ["lock", "fair_lock", "semaphore"])
async def test_a_body_that_keeps_the_loop_past_its_lease_reads_it_lost_at_once(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """A body that runs past its lease's end without yielding (CPU-bound work, or a loop the
    machine stalled while the body's own wake-up was queued ahead of the lease timer) reads
    ``lost`` as True at once: the read runs the timer's work, log and counters included."""
    if kind == "semaphore":
        lock: Any = aiolock_client.semaphore("busy", 1)
    else:
        lock = getattr(aiolock_client, kind)("busy")
    loop = asyncio.get_running_loop()
    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        async with lock.acquire(lease=0.2) as guard:
            end = loop.time() + guard.valid_for() + 0.01  # valid_for() reads the clock later
            while loop.time() <= end:  # no await: the lease timer cannot run
                pass
            assert guard.lost
    assert lock.statistics().losses == 1


async def test_a_renewal_read_after_the_lease_deadline_still_keeps_the_hold(
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server renewed the lease, and the watchdog reads that reply only after the
    client's deadline has passed (a busy loop): the reply proves the lease never ran out, so
    the hold is kept, not taken for lost by the clock."""
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock("late-renewal")
    runner = services_of(client).calls
    run_synced = runner.run_synced
    loop = asyncio.get_running_loop()
    late: list[Any] = []  # the hold whose next renewal reply is read late

    async def read_late(script: Any, *args: Any, **kwargs: Any) -> Any:
        reply = await run_synced(script, *args, **kwargs)
        if late and script is _scripts.LOCK_RENEW:
            hold = late.pop()
            while loop.time() <= hold.expires_at:  # no await: the lease timer cannot run
                pass
        return reply

    monkeypatch.setattr(runner, "run_synced", read_late)
    async with lock.acquire() as guard:
        late.append(lock.hold(lock.current_owner()[0]))
        await eventually(lambda: not late and lock.statistics().renewals >= 2, what="renewed")
        assert not guard.lost
        assert await lock.is_held()
    assert lock.statistics().losses == 0


class _Stall:
    """Once armed, block the event loop for ``seconds`` at its next turn after the next call's
    bytes were written (a GC pause, a busy machine): the loop then meets the call's reply and
    any timer that came due meanwhile in one turn, and runs the timer first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
        self.armed = False
        write = wire.write

        async def stalling(conn: Any, *commands: tuple[Any, ...]) -> None:
            await write(conn, *commands)
            if self.armed:
                self.armed = False
                asyncio.get_running_loop().call_soon(time.sleep, seconds)

        monkeypatch.setattr(wire, "write", stalling)


@pytest.mark.parametrize("kind", ["lock", "fair_lock", "semaphore"])
async def test_a_lease_that_runs_out_after_the_release_left_is_no_loss(
    aiolock_client: aiolock.Client, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body ended and its release went out with lease to spare, then the loop stalled past
    the lease's end: it runs the lease timer before it reads the reply, which says released.
    The critical section ended in time: no loss (the chaos run's spurious loss)."""
    stall = _Stall(monkeypatch, 0.9)
    if kind == "semaphore":
        semaphore = aiolock_client.semaphore("lapsed", 2)
        async with semaphore.acquire(lease=1.0):
            pass  # the server has the scripts: the release is one call (no NOSCRIPT)
        async with semaphore.acquire(lease=1.0) as permit:
            await asyncio.sleep(0.3)
            stall.armed = True  # the release's
        assert not permit.lost
        assert semaphore.statistics().losses == 0
        assert await semaphore.available() == 2
        return
    lock = getattr(aiolock_client, kind)("lapsed")
    async with lock.acquire(lease=1.0):
        pass  # the server has the scripts: the release is one call (no NOSCRIPT)
    async with lock.acquire(lease=1.0) as guard:
        await asyncio.sleep(0.3)
        stall.armed = True
    assert not guard.lost
    assert lock.statistics().losses == 0
    assert not await lock.is_locked()


async def test_a_release_answered_after_its_client_closed_returns_as_answered(
    make_client: MakeClient,
) -> None:
    """Closing does not wait for calls in flight, and forgets what the client tracked: a
    release whose reply is read after that returns all the same (it found its in-flight mark
    gone, and raised ValueError once)."""
    client = make_client()
    lock = client.lock("released-after-close", owner="job")  # released from another task
    await lock.lock(lease=5)
    runner = services_of(client).calls
    command = runner.command
    sent, go_on = asyncio.Event(), asyncio.Event()

    async def answered_late(*args: Any, **kwargs: Any) -> Any:
        sent.set()
        reply = await command(*args, **kwargs)
        await go_on.wait()  # the reply is in: the caller reads it once the client closed
        return reply

    runner.command = answered_late  # type: ignore[method-assign]
    releasing = asyncio.create_task(lock.unlock())
    await sent.wait()
    await client.aclose()
    go_on.set()
    await releasing


async def test_a_reentrant_hold_that_outlives_its_lease_during_an_inner_release_is_lost(
    aiolock_client: aiolock.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same stall during an inner release: that release ended in time, but the outer hold
    is still held once its reply is read, and its lease has run out."""
    stall = _Stall(monkeypatch, 0.9)
    lock = aiolock_client.lock("lapsed-reentrant")
    async with lock.acquire(lease=1.0), lock.acquire(lease=1.0):
        pass  # the server has the scripts: the inner release is one call (no NOSCRIPT)
    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        async with lock.acquire(lease=1.0) as outer:
            async with lock.acquire(lease=1.0) as inner:
                await asyncio.sleep(0.3)
                stall.armed = True  # the inner release's
            assert not inner.lost
            await eventually(lambda: outer.lost, what="the outer hold reported lost")
    assert lock.statistics().losses == 1


async def test_body_error_after_loss_keeps_its_type(make_client: MakeClient) -> None:
    client = make_client()
    lock = client.lock("error-after-loss")
    with pytest.raises(KeyError) as raised:
        async with lock.acquire():
            await client.lock("error-after-loss").force_unlock()
            raise KeyError("body")
    assert any("lost while held" in note for note in raised.value.__notes__)


async def test_cancel_on_loss_cancels_a_sleeping_body(make_client: MakeClient) -> None:
    client = make_client(watchdog_timeout=0.6)
    other = make_client()
    lock = client.lock("cancel-me")
    entered = asyncio.Event()
    reached_end = False

    async def body() -> None:
        nonlocal reached_end
        async with lock.acquire(cancel_on_loss=True):
            entered.set()
            await asyncio.sleep(30)
            reached_end = True

    async def run() -> tuple[BaseException | None, int]:
        try:
            await body()
        except aiolock.LockLostError as exc:
            task = asyncio.current_task()
            assert task is not None
            return exc, task.cancelling()
        return None, -1

    runner = asyncio.create_task(run())
    await entered.wait()
    assert await other.lock("cancel-me").force_unlock()  # the holder's watchdog notices
    error, cancelling = await asyncio.wait_for(runner, 2 * client.watchdog_timeout)
    assert isinstance(error, aiolock.LockLostError)
    assert cancelling == 0
    assert not reached_end


async def test_cancel_on_loss_cancels_once_and_cleanup_awaits_run(
    make_client: MakeClient, redis: Redis
) -> None:
    # As asyncio.timeout(): one cancellation at the loss; the body's own cleanup awaits (a
    # rollback, a log call that awaits) are not cancelled again.
    client = make_client(watchdog_timeout=0.6)
    lock = client.lock("clean-up")
    entered = asyncio.Event()
    cleanup: list[str] = []

    async def body() -> None:
        async with lock.acquire(cancel_on_loss=True):
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await redis.set("rolled-back", "1")  # an awaited rollback
                cleanup.append("except")
                raise
            finally:
                await asyncio.sleep(0.01)
                await redis.incr("finally")
                cleanup.append("finally")

    async def run() -> tuple[BaseException | None, int]:
        try:
            await body()
        except aiolock.LockLostError as exc:
            task = asyncio.current_task()
            assert task is not None
            return exc, task.cancelling()
        return None, -1

    runner = asyncio.create_task(run())
    await entered.wait()
    assert await make_client().lock("clean-up").force_unlock()
    error, cancelling = await asyncio.wait_for(runner, 10 * client.watchdog_timeout)
    assert isinstance(error, aiolock.LockLostError)
    assert cancelling == 0
    assert cleanup == ["except", "finally"]
    assert await redis.get("rolled-back") == "1"
    assert await redis.get("finally") == "1"


async def test_a_loss_the_body_learns_itself_does_not_cancel_its_cleanup(
    make_client: MakeClient, redis: Redis
) -> None:
    # The block's own transaction finds the hold gone and raises LockLostError: the block
    # knows, and its except/finally awaits are not cancelled on top of it.
    client = make_client()
    lock = client.lock("told")
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire(lease=30, cancel_on_loss=True) as guard:
            assert await make_client().lock("told").force_unlock()
            try:
                async with guard.transaction() as tx:
                    tx.set(f"{lock.hash_tag}:data", "1")
            except aiolock.LockLostError:
                await asyncio.sleep(0.01)
                await redis.set("rolled-back", "1")
                raise
    assert await redis.get("rolled-back") == "1"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_a_body_that_swallows_the_loss_cancellation_still_raises_lock_lost(
    make_client: MakeClient,
) -> None:
    client = make_client(watchdog_timeout=0.6)
    lock = client.lock("swallowed")
    entered = asyncio.Event()
    swallowed = False

    async def body() -> None:
        nonlocal swallowed
        async with lock.acquire(cancel_on_loss=True):
            entered.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                swallowed = True  # and carries on to the end of the block

    task = asyncio.create_task(body())
    await entered.wait()
    assert await make_client().lock("swallowed").force_unlock()
    with pytest.raises(aiolock.LockLostError):
        await asyncio.wait_for(task, 10 * client.watchdog_timeout)
    assert swallowed
    assert task.cancelling() == 0


async def test_cancel_on_loss_does_not_hide_outer_cancellation(
    aiolock_client: aiolock.Client,
) -> None:
    lock = aiolock_client.lock("outer-cancel")
    entered = asyncio.Event()

    async def body() -> None:
        async with lock.acquire(cancel_on_loss=True):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not await lock.is_locked()


async def test_fencing_tokens_strictly_increase(make_client: MakeClient, redis: Redis) -> None:
    clients = [make_client() for _ in range(3)]
    grants: list[int] = []
    rng = random.Random(7)

    async def worker(client: aiolock.Client) -> None:
        lock = client.lock("fenced")
        for _ in range(5):
            async with lock.acquire(wait=30) as guard:
                grants.append(guard.fencing_token)
                async with lock.acquire() as inner:  # reentrant: same token
                    assert inner.fencing_token == guard.fencing_token
                await asyncio.sleep(rng.random() / 1000)

    await asyncio.gather(*(worker(c) for c in clients for _ in range(4)))
    assert len(grants) == 60
    assert grants == sorted(grants)
    assert len(set(grants)) == 60


async def test_tokens_after_expiry_and_force(make_client: MakeClient) -> None:
    client, other = make_client(), make_client()
    lock = client.lock("fence-2")
    tokens = []
    async with lock.acquire() as guard:
        tokens.append(guard.fencing_token)
    assert await lock.try_lock(lease=0.05)

    async def expired() -> bool:
        return not await lock.is_locked()

    await eventually(expired)
    async with lock.acquire() as guard:
        tokens.append(guard.fencing_token)
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire() as guard:
            tokens.append(guard.fencing_token)
            await other.lock("fence-2").force_unlock()
    async with other.lock("fence-2").acquire() as guard:
        tokens.append(guard.fencing_token)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


async def test_owner_that_ends_without_unlocking_has_its_lock_released(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(watchdog_timeout=30)
    lock = client.lock("abandoned")

    async def careless() -> None:
        await lock.lock()

    with caplog.at_level(logging.WARNING, logger="aiolock"):
        await asyncio.create_task(careless())

        async def released() -> bool:
            return not await lock.is_locked()

        # At once, not after the 30 s watchdog lease.
        await eventually(released, timeout=3, what="the abandoned lock released")
    assert any("ended holding" in r.getMessage() for r in caplog.records)
    assert services_of(client).holds.watched() == []


async def test_explicit_owner_spans_tasks(aiolock_client: aiolock.Client, redis: Redis) -> None:
    job = aiolock_client.lock("job", owner="job-17")
    handed_over = asyncio.Event()

    async def web_handler() -> None:
        await job.lock()
        handed_over.set()

    async def worker() -> None:
        await handed_over.wait()
        assert await job.is_held()
        await job.unlock()

    await asyncio.gather(web_handler(), worker())
    assert not await job.is_locked()
    await assert_clean(redis, aiolock_client)


async def test_task_and_explicit_owners_never_mix(aiolock_client: aiolock.Client) -> None:
    by_task = aiolock_client.lock("mixed")
    by_name = aiolock_client.lock("mixed", owner="t1")
    await by_task.lock()
    assert not await by_name.try_lock()
    assert not await by_name.is_held()
    with pytest.raises(aiolock.LockNotOwnedError):
        await by_name.unlock()
    await by_task.unlock()
    await by_name.lock()
    assert not await by_task.try_lock()
    await by_name.unlock()
