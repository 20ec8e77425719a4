"""The settlement rules, against a runner that scripts the transport's outcomes (no server).

``aiolock/_core/settlement.py`` and ``docs/internals.md`` ("Exactly-once holds") state them; each
test below names the one it checks.  The runner (:mod:`tests.unit.fake_runner`) answers what the
test says and records what was sent; the loop's clock jumps to its next timer
(:mod:`tests.unit.virtual_clock`), so backoffs, leases and resend windows take no wall time.
A ``sleep`` here moves that clock on (past a lease, a window): the loop runs every callback
that is ready before the clock moves, so after it everything that could happen by then has.
The real-server tests (``integration/concerns/test_resend.py``, ``test_calls.py``,
``chaos/test_unknown_outcome.py``) check what the scripts do with the same calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from aiolock import AsyncRLock, AsyncSemaphore, LockNotOwnedError, LockSyncError
from aiolock._core.services import Services
from aiolock.lock import wake_prefix
from aiolock.semaphore import permits_of
from tests.unit.fake_runner import (
    Fail,
    FakeRunner,
    Held,
    Reply,
    Resent,
    Sent,
    fake_services,
)
from tests.unit.virtual_clock import VirtualClockLoop

pytestmark = pytest.mark.anyio

ACQUIRE, RELEASE, VOID = "lock/acquire", "lock/release", "common/void"
HDEL, WAKE = "HDEL", "lock/wake"
OWNER = "me"  # the lock's explicit owner
ID = "fake-client:x:me"  # the id the client sends for it
LEASE = 10.0  # seconds: every acquire here asks for it
WINDOW = 2.0  # the client's resend window, seconds
WINDOW_MS = round(WINDOW * 1000)
WATCHDOG = 5.0  # the client's watchdog_timeout


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": VirtualClockLoop}


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
async def services(runner: FakeRunner) -> AsyncIterator[Services]:
    async with fake_services(runner, watchdog_timeout=WATCHDOG, resend_window=WINDOW) as made:
        yield made


@pytest.fixture
async def lock(services: Services) -> AsyncRLock:
    """A reentrant lock of the explicit owner ``OWNER`` (no task ties its holds)."""
    made = AsyncRLock(services, "orders", OWNER)
    assert made.current_owner()[0] == ID
    return made


def now() -> float:
    return asyncio.get_running_loop().time()


async def settled(lock: AsyncRLock, owner: str = ID) -> None:
    """Wait for the owner's settlements on the lock (what its next acquire waits for)."""

    await lock.services.holds.wait_pending(lock.keys.lock, owner)


def held_count(lock: AsyncRLock) -> int:
    """Holds the client believes the lock's owner has (no I/O)."""
    return lock.statistics().held


def request_of(acquire: Sent) -> int:
    """The request id an acquire was sent as (ARGV: lease, owner, request, parks, ...)."""
    return int(acquire.args[2])


def _undo_at(release: Sent) -> int:
    # ARGV: owner, request[, undo, window]; the plain lock's has its waiting client before undo.
    return 3 if release.name == "lock/release" else 2


def undo_of(release: Sent) -> int | None:
    """The acquire a release undoes."""
    at = _undo_at(release)
    return int(release.args[at]) if len(release.args) > at else None


def window_of(release: Sent) -> int:
    """The resend window an undo marks an unapplied acquire for."""
    return int(release.args[_undo_at(release) + 1])


async def hold(lock: AsyncRLock, runner: FakeRunner, count: int = 1) -> None:
    """Take ``count`` fault-free holds of ``lock`` (the server answers each grant)."""
    token = 7
    for held in range(1, count + 1):
        runner.script(ACQUIRE, Reply(token if held == 1 else [token, held, round(LEASE * 1000)]))
        assert await lock.try_lock(lease=LEASE)
    assert held_count(lock) == count


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- an acquire whose outcome its caller never saw ----------------------------------------------


async def test_an_acquire_cancelled_in_flight_has_its_late_grant_undone_by_its_request_id(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a grant its caller never saw is undone, exactly that one (the release's undo mode
    names the acquire's request), once the call is over; it marks an unapplied acquire for the
    resend window."""
    reply = Held()
    runner.script(ACQUIRE, reply)
    runner.answer(RELEASE, 0)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await reply.reached.wait()
    await cancel(task)
    assert runner.named(RELEASE) == []  # nothing to undo before the outcome is known
    reply.answer(7)  # the grant arrives after its caller left
    await settled(lock)
    [acquire] = runner.named(ACQUIRE)
    [undo] = runner.named(RELEASE)
    assert undo.args[0] == ID
    assert undo_of(undo) == request_of(acquire)
    assert undo.args[1] != request_of(acquire)  # a request of its own
    assert window_of(undo) == WINDOW_MS  # an unapplied acquire is marked for the window
    assert held_count(lock) == 0


async def test_an_acquire_past_its_wait_has_its_late_grant_undone(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: ``wait`` bounds the whole acquire, calls in flight included; a grant that arrives
    after the deadline is undone in the background, as for a cancelled caller."""
    reply = Held()
    runner.script(ACQUIRE, reply)
    runner.answer(RELEASE, 0)
    runner.answer(WAKE, 1)  # it left with a try unanswered: its client leaves the waiting set
    began = now()
    assert await lock.try_lock(wait=0.5, lease=LEASE) is False
    assert now() == pytest.approx(began + 0.5)
    reply.answer(7)
    await settled(lock)
    [acquire] = runner.named(ACQUIRE)
    [undo] = runner.named(RELEASE)
    assert undo_of(undo) == request_of(acquire)


async def test_an_acquire_cancelled_in_flight_and_refused_leaves_nothing_to_undo(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: the lock was busy: nothing was granted, nothing is sent."""
    reply = Held()
    runner.script(ACQUIRE, reply)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await reply.reached.wait()
    await cancel(task)
    reply.answer([1234])  # refused: the holder's PTTL
    await settled(lock)
    assert [sent.name for sent in runner.sent] == [ACQUIRE]


async def test_an_acquire_cancelled_before_it_was_written_sends_nothing_more(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a call cancelled before any of it reached the server (``NotSent``) has nothing to
    settle."""
    queued = Held(written=False)  # waiting for a connection
    runner.script(ACQUIRE, queued)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await queued.reached.wait()
    await cancel(task)
    await settled(lock)
    assert runner.sent == []


@pytest.mark.parametrize("error", [RedisConnectionError("dropped"), RedisTimeoutError("slow")])
async def test_an_acquire_whose_reply_was_lost_raises_and_is_undone(
    runner: FakeRunner, lock: AsyncRLock, error: Exception
) -> None:
    """Rule: a call that fails after its request was written has an outcome just as unknown:
    the caller gets the error, and the acquire is undone (if it landed: the undo says so)."""
    runner.script(ACQUIRE, Fail(error))
    runner.answer(RELEASE, None)  # the acquire had not landed: the undo finds no hold
    with pytest.raises(type(error)):
        await lock.try_lock(lease=LEASE)
    await settled(lock)
    [acquire] = runner.named(ACQUIRE)
    [undo] = runner.named(RELEASE)
    assert undo_of(undo) == request_of(acquire)
    assert held_count(lock) == 0


async def test_an_acquire_that_failed_before_it_was_written_is_not_undone(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: an error before the call was written leaves a known outcome: nothing ran."""
    runner.script(ACQUIRE, Fail(RedisConnectionError("refused"), written=False))
    with pytest.raises(RedisConnectionError):
        await lock.try_lock(lease=LEASE)
    await settled(lock)
    assert runner.sent == []


async def test_the_owners_next_acquire_waits_for_the_settlement(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: the owner's next acquire on that name waits for the settlement, so that it never
    meets the grant being undone (and the hold counts stay exact)."""
    first, undo = Held(), Held()
    runner.script(ACQUIRE, first, Reply(8))
    runner.script(RELEASE, undo)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await first.reached.wait()
    await cancel(task)
    again = asyncio.create_task(lock.try_lock(lease=LEASE))
    first.answer(7)
    await undo.reached.wait()
    assert len(runner.named(ACQUIRE)) == 1  # the next acquire has not been sent
    assert not again.done()
    undo.answer(0)
    assert await again
    assert [sent.name for sent in runner.sent] == [ACQUIRE, RELEASE, ACQUIRE]
    assert held_count(lock) == 1


async def test_a_resent_call_carries_the_same_request_id_and_the_resend_mark(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a resend is the same request (the scripts apply it once); it carries the resend
    window, so that its script voids the request for that long; the hold remembers the resent
    request and voids it before the release that ends the hold."""
    runner.script(ACQUIRE, Resent(Reply(7)))
    assert await lock.try_lock(lease=LEASE)
    first, resend = runner.named(ACQUIRE)
    assert not first.resend
    assert resend.resend
    assert resend.args == (*first.args, WINDOW_MS)
    runner.answer(VOID, 1)
    runner.answer(RELEASE, 0)
    await lock.unlock()
    void, release = runner.sent[2:]
    assert void.name == VOID
    assert void.args[0] == ID
    assert request_of(first) in void.args[2:]
    assert release.name == RELEASE  # not the bare command: the hold had a fault
    assert held_count(lock) == 0


async def test_a_resent_acquire_whose_caller_left_is_voided_then_undone(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: the settlement of a resent call whose caller left voids its request first (a first
    copy may still arrive), then undoes the grant."""
    reply = Held()
    runner.script(ACQUIRE, Resent(reply))
    runner.answer(VOID, 1)
    runner.answer(RELEASE, 0)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await reply.reached.wait()
    await cancel(task)
    reply.answer(7)
    await settled(lock)
    first, _, void, undo = runner.sent
    assert [sent.name for sent in runner.sent] == [ACQUIRE, ACQUIRE, VOID, RELEASE]
    assert void.args == (ID, WINDOW_MS, request_of(first))
    assert undo_of(undo) == request_of(first)


async def test_an_acquire_cancelled_between_a_failed_copy_and_its_resend_is_undone(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a call cancelled between two copies has an unknown outcome (the first may have
    run, or still arrive): it is undone at once, and an undo that finds it not applied marks
    it, so that a late first copy grants nothing (no void: no resend was written)."""
    waiting = Held(written=False)
    runner.script(ACQUIRE, Resent(waiting))
    runner.answer(VOID, 1)
    runner.answer(RELEASE, None)
    task = asyncio.create_task(lock.try_lock(lease=LEASE))
    await waiting.reached.wait()
    await cancel(task)
    await settled(lock)
    [acquire] = runner.named(ACQUIRE)
    assert [sent.name for sent in runner.sent] == [ACQUIRE, RELEASE]
    assert undo_of(runner.named(RELEASE)[0]) == request_of(acquire)


async def test_a_permit_acquire_cancelled_in_flight_is_undone_under_its_permit_id(
    runner: FakeRunner, services: Services
) -> None:
    """Rule: the same for every kind: a semaphore's permit taken by a caller that left is
    given back, exactly that grant (the permit id is the owner of one acquisition)."""
    semaphore = AsyncSemaphore(services, "pool", 3)
    reply = Held()
    runner.script("semaphore/acquire", reply)
    runner.answer("semaphore/release", 0)
    task = asyncio.create_task(semaphore.try_acquire(lease=LEASE))
    await reply.reached.wait()
    await cancel(task)
    reply.answer([0, 1, round(LEASE * 1000)])
    [acquire] = runner.named("semaphore/acquire")
    permit = acquire.args[1]
    await services.holds.wait_pending(permits_of(semaphore).keys.lock, permit)
    [undo] = runner.named("semaphore/release")
    assert undo.args[0] == permit
    assert undo_of(undo) == request_of(acquire)
    assert window_of(undo) == WINDOW_MS
    assert semaphore.statistics().held == 0


# -- an undo or a release that fails --------------------------------------------------------------


async def test_an_undo_that_fails_is_resent_with_the_same_ids_until_it_lands(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a settlement sends its (idempotent) call again, with a backoff of 20 ms doubling,
    until it lands: every copy is the same request, undoing the same acquire."""
    runner.script(ACQUIRE, Fail(RedisConnectionError("dropped")))
    lost = RedisConnectionError("still down")
    runner.script(RELEASE, Fail(lost), Fail(lost), Fail(lost), Reply(None))
    began = now()
    with pytest.raises(RedisConnectionError):
        await lock.try_lock(lease=LEASE)
    await settled(lock)
    undos = runner.named(RELEASE)
    assert len(undos) == 4
    assert len({sent.args for sent in undos}) == 1
    assert now() - began == pytest.approx(0.02 + 0.04 + 0.08)


async def test_an_undo_that_never_lands_gives_up_once_the_hold_surely_ended(
    runner: FakeRunner, lock: AsyncRLock, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a settlement gives up once every hold it may concern has surely expired (the
    lease, at least ``watchdog_timeout``, plus a margin for a server that applied it late),
    with its last try at that moment; the give-up is logged and remembered, so that meeting
    the hold later is a warning, not a bug signal."""
    runner.script(ACQUIRE, Fail(RedisConnectionError("dropped")))
    runner.always(RELEASE, Fail(RedisConnectionError("down")))
    began = now()
    with pytest.raises(RedisConnectionError):
        await lock.try_lock(lease=LEASE)
    await settled(lock)
    assert now() == pytest.approx(began + LEASE + 1.0)  # the lease, and the margin
    assert "gave up releasing 'orders' in the background" in caplog.text
    # The hold it could not undo is met later: a warning that says why, and it is dropped.
    await hold(lock, runner, count=2)
    runner.script(RELEASE, Reply(2), Reply(1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, "aiolock.lock"):
        assert await lock.release_one(ID) == 2
        await settled(lock)
    [record] = [r for r in caplog.records if "did not know of" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "left by a release that gave up" in record.getMessage()
    assert held_count(lock) == 1


async def test_an_acquire_granted_past_its_lease_is_given_back(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a grant whose lease ran out by the client's clock before its reply came (the
    request waited on a frozen path) is lost to its caller and given back at once: nobody can
    count on it."""
    reply = Held()
    runner.script(ACQUIRE, reply)
    runner.answer(RELEASE, 0)
    task = asyncio.create_task(lock.try_lock(lease=1.0))
    await reply.reached.wait()
    await asyncio.sleep(1.5)  # the path is frozen past the lease
    reply.answer(7)
    assert await task  # the caller holds it, lost
    assert held_count(lock) == 0
    await settled(lock)
    [acquire] = runner.named(ACQUIRE)
    [undo] = runner.named(RELEASE)
    assert undo_of(undo) == request_of(acquire)


async def test_a_grant_too_few_replicas_confirmed_is_undone_and_raises(
    runner: FakeRunner,
) -> None:
    """Rule: with ``sync_replicas``, a grant fewer replicas confirmed in time is undone (a
    failover could forget it), before the caller hears ``LockSyncError``."""
    async with fake_services(runner, resend_window=WINDOW, sync=(1, 0.5)) as services:
        lock = AsyncRLock(services, "orders", OWNER)
        runner.script(ACQUIRE, Reply(7, synced=0))
        runner.answer(RELEASE, 0)
        with pytest.raises(LockSyncError, match="0 of the 1 replica"):
            await lock.try_lock(lease=LEASE)
        [acquire] = runner.named(ACQUIRE)
        [undo] = runner.named(RELEASE)  # undone before the error was raised
        assert undo_of(undo) == request_of(acquire)
        assert held_count(lock) == 0


async def test_a_grant_that_reentered_holds_the_client_never_saw_is_cut_back_to_one(
    runner: FakeRunner, lock: AsyncRLock, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a grant that re-enters holds the client did not know of (a late copy of an earlier
    request) is cut back to the one hold it knows; the unknown ones are released."""
    runner.script(ACQUIRE, Reply([7, 3, round(LEASE * 1000)]))
    runner.answer(RELEASE, 1)
    assert await lock.try_lock(lease=LEASE)
    assert held_count(lock) == 1
    await settled(lock)
    drops = runner.named(RELEASE)
    assert len(drops) == 2
    assert all(undo_of(sent) is None for sent in drops)  # releases, not undos
    assert "had 2 hold(s) of this owner the client never saw" in caplog.text


@pytest.mark.parametrize("count", [1, 2])
async def test_a_grant_that_reentered_a_hold_taken_for_lost_is_dropped_and_tried_again(
    runner: FakeRunner, lock: AsyncRLock, count: int
) -> None:
    """Rule: a grant with the token of the owner's hold the client took for lost (its clock
    runs a little ahead of the server's) is not a fresh grant: every hold of it is released
    as a settlement, and the caller tries again."""
    runner.script(ACQUIRE, Reply(7))
    assert await lock.try_lock(lease=1.0)
    await asyncio.sleep(1.0)
    assert lock.statistics().lost
    runner.script(ACQUIRE, Reply([7, count, 5]), Reply(8))
    runner.answer(RELEASE, 0)
    assert await lock.try_lock(lease=LEASE)
    assert [sent.name for sent in runner.sent[1:]] == [ACQUIRE, *[RELEASE] * count, ACQUIRE]
    assert all(undo_of(sent) is None for sent in runner.named(RELEASE))
    hold = lock.hold(ID)
    assert hold is not None
    assert (hold.token, hold.count) == (8, 1)


async def test_a_release_whose_reply_was_lost_is_no_longer_held_and_is_resent(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a release that fails is no longer counted as held (the watchdog would renew a
    hold that may be gone, and the next acquire would re-enter it), and it is completed in the
    background: resent as the same request until it lands."""
    await hold(lock, runner, count=2)
    runner.script(RELEASE, Fail(RedisConnectionError("dropped")), Reply(1))
    runner.answer(WAKE, 1)
    with pytest.raises(RedisConnectionError):
        await lock.unlock()
    assert held_count(lock) == 1  # one hold less, at once
    await settled(lock)
    first, resend = runner.named(RELEASE)
    assert first.args == resend.args  # the same request
    assert held_count(lock) == 1
    # The first copy may have deleted the lock and the mark of a waiter refused meanwhile,
    # whose hand-over it owed: a resend cannot tell, so it hands the lock over (if it is free).
    [wake] = runner.named(WAKE)
    keys = lock.keys
    assert wake.keys == (keys.lock, keys.waiting, wake_prefix(keys.lock), keys.fence)


async def test_a_last_plain_release_whose_reply_was_lost_leaves_nothing_held(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: as above, for the owner's last hold, which the fault-free path ends with a plain
    ``HDEL``: nothing is tracked as held from the failure on, and the release is completed by
    the release script, as the same request."""
    await hold(lock, runner)
    runner.script(HDEL, Fail(RedisConnectionError("dropped")))
    runner.answer(RELEASE, 0)
    runner.answer(WAKE, 1)
    with pytest.raises(RedisConnectionError):
        await lock.unlock()

    assert lock.hold(ID) is None
    assert held_count(lock) == 0
    await settled(lock)
    [release] = runner.named(RELEASE)
    assert release.args[0] == ID
    assert undo_of(release) is None


async def test_a_release_cancelled_in_flight_is_recorded_from_its_late_reply(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a release whose caller was cancelled is recorded from its reply when it comes;
    nothing is resent."""
    await hold(lock, runner, count=3)
    reply = Held()
    runner.script(RELEASE, reply)
    task = asyncio.create_task(lock.unlock())
    await reply.reached.wait()
    await cancel(task)
    assert held_count(lock) == 2
    reply.answer(1)  # the server had one hold fewer than the client thought: it says so
    await settled(lock)
    assert held_count(lock) == 1
    assert len(runner.named(RELEASE)) == 1


async def test_a_release_cancelled_before_it_was_sent_is_sent_all_the_same(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: the release completes even if its caller is cancelled before it was sent (while it
    waited for an earlier settlement of the owner)."""
    await hold(lock, runner, count=2)
    blocker = asyncio.Event()

    async def earlier_settlement() -> None:
        await blocker.wait()

    lock.services.holds.defer(lock.keys.lock, ID, earlier_settlement())
    runner.answer(RELEASE, 1)
    runner.answer(WAKE, 1)
    task = asyncio.create_task(lock.unlock())
    await asyncio.sleep(0.1)
    await cancel(task)
    assert runner.named(RELEASE) == []
    assert held_count(lock) == 1
    blocker.set()
    await settled(lock)
    [release] = runner.named(RELEASE)
    assert release.args[0] == ID
    assert held_count(lock) == 1


async def test_a_plain_release_cancelled_in_flight_is_recorded_from_its_late_reply(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a plain release whose caller was cancelled is read as its script's reply would be
    (3 fields or more: released), and its late copy could still arrive: the owner's holds go
    by another id."""
    await hold(lock, runner)
    reply = Held()
    runner.script(HDEL, reply)
    task = asyncio.create_task(lock.unlock())
    await reply.reached.wait()
    await cancel(task)
    assert held_count(lock) == 0
    reply.answer(3)
    await settled(lock)
    assert [sent.name for sent in runner.sent[1:]] == [HDEL]  # nothing resent, no wake-up
    assert lock.current_owner()[0] != ID


async def test_a_resent_release_is_carried_by_the_owners_acquires_for_the_window(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: once a release that was resent is answered, its id is kept for the resend window,
    and the owner's acquires of the lock carry it (``late:<ids>``), so that its late first copy
    cannot end the newer hold; after the window, nothing is carried."""
    await hold(lock, runner, count=2)
    runner.script(RELEASE, Resent(Reply(1)))
    await lock.unlock()
    first, resend = runner.named(RELEASE)
    assert resend.args == first.args  # a release carries no mark: its own id refuses it
    runner.script(ACQUIRE, Reply([7, 2, 10000]))
    assert await lock.try_lock(lease=LEASE)
    assert runner.named(ACQUIRE)[-1].args[-1] == f"late:{first.args[1]}"
    await asyncio.sleep(WINDOW)
    runner.script(ACQUIRE, Reply([7, 3, 10000]))
    assert await lock.try_lock(lease=LEASE)
    assert not str(runner.named(ACQUIRE)[-1].args[-1]).startswith("late:")


async def test_a_plain_release_with_an_unknown_outcome_renames_the_owner_for_the_window(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a plain release cannot refuse a late copy of itself, which would end the owner's
    next hold: after one whose outcome is unknown, the owner's holds of the lock go by another
    id (``<owner>~<request>``) for the resend window, and as long as a hold made under it
    lasts; then by its own again."""
    await hold(lock, runner)
    runner.script(HDEL, Fail(RedisTimeoutError("slow")))
    runner.answer(RELEASE, 0)
    runner.answer(WAKE, 1)
    with pytest.raises(RedisTimeoutError):
        await lock.unlock()
    [plain] = runner.named(HDEL)
    await settled(lock)
    [completed] = runner.named(RELEASE)
    assert completed.args[0] == ID  # completed under the id it ended
    alias = lock.current_owner()[0]
    assert alias != ID
    runner.script(ACQUIRE, Reply(8))
    assert await lock.try_lock(lease=LEASE)
    assert runner.named(ACQUIRE)[-1].args[1] == alias
    assert ID in plain.args  # the late copy names the old id's fields only
    assert alias not in plain.args
    await asyncio.sleep(WINDOW)  # past the window, but the hold made under the alias lasts
    runner.script(HDEL, Reply(3))
    await lock.unlock()
    assert runner.named(HDEL)[-1].args[1] == alias
    runner.script(ACQUIRE, Reply(9))
    assert await lock.try_lock(lease=LEASE)
    assert runner.named(ACQUIRE)[-1].args[1] == ID


async def test_the_next_acquire_under_the_new_id_waits_for_the_plain_releases_settlement(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: the owner's next acquire waits for the settlement of its release, also when it
    goes by another id since: until the release is completed the old id may still hold the
    lock on the server, and a try would be refused by the owner's own hold."""
    await hold(lock, runner)
    runner.script(HDEL, Fail(RedisTimeoutError("slow")))
    completing = Held()
    runner.script(RELEASE, completing)
    runner.answer(WAKE, 1)
    with pytest.raises(RedisTimeoutError):
        await lock.unlock()
    runner.script(ACQUIRE, Reply(8))
    again = asyncio.create_task(lock.try_lock(lease=LEASE))
    await completing.reached.wait()
    await asyncio.sleep(0.1)
    assert len(runner.named(ACQUIRE)) == 1  # not sent while the release is in flight
    completing.answer(0)
    assert await again
    assert [sent.name for sent in runner.sent[-3:]] == [RELEASE, WAKE, ACQUIRE]
    assert runner.named(ACQUIRE)[-1].args[1] != ID


async def test_a_second_new_id_waits_for_the_settlement_of_the_first(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: as above, when the hold made under the new id also ends in a plain release with an
    unknown outcome: the id after it waits for that release's settlement."""
    await hold(lock, runner)
    runner.script(HDEL, Fail(RedisTimeoutError("slow")))
    runner.answer(WAKE, 1)
    runner.script(RELEASE, Reply(0))
    with pytest.raises(RedisTimeoutError):
        await lock.unlock()
    runner.script(ACQUIRE, Reply(8))
    assert await lock.try_lock(lease=LEASE)  # under the first new id
    runner.script(HDEL, Fail(RedisTimeoutError("slow again")))
    completing = Held()
    runner.script(RELEASE, completing)
    with pytest.raises(RedisTimeoutError):
        await lock.unlock()
    runner.script(ACQUIRE, Reply(9))
    again = asyncio.create_task(lock.try_lock(lease=LEASE))
    await completing.reached.wait()
    await asyncio.sleep(0.1)
    assert len(runner.named(ACQUIRE)) == 2  # not sent while the release is in flight
    completing.answer(0)
    assert await again
    first, second, third = (sent.args[1] for sent in runner.named(ACQUIRE))
    assert len({first, second, third}) == 3
    assert runner.named(RELEASE)[-1].args[0] == second  # the release the third id waited for


async def test_a_new_id_is_no_other_owners_id(
    runner: FakeRunner, services: Services, lock: AsyncRLock
) -> None:
    """The id an owner goes by after a plain release with an unknown outcome is nobody else's:
    not that of an explicit owner whose name looks like it (two owners under one id would
    share their holds), and it keeps the client's id as its prefix (which the fair lock's
    scripts read)."""
    await hold(lock, runner)
    runner.script(HDEL, Fail(RedisTimeoutError("slow")))
    runner.answer(RELEASE, 0)
    runner.answer(WAKE, 1)
    with pytest.raises(RedisTimeoutError):
        await lock.unlock()
    await settled(lock)
    [release] = runner.named(RELEASE)
    request = release.args[1]
    new_id = lock.current_owner()[0]
    assert new_id != ID
    assert new_id.partition(":")[0] == "fake-client"
    lookalikes = [f"{OWNER}~{request}", f"{OWNER}:a{request}", f"a{request}:x:{OWNER}"]
    for name in lookalikes:
        assert AsyncRLock(services, "orders", name).current_owner()[0] != new_id


async def test_a_resent_plain_release_renames_the_owner_too(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: as above, for a plain release that was resent and answered: its first copy may
    still arrive."""
    await hold(lock, runner)
    runner.script(HDEL, Resent(Reply(3)))
    await lock.unlock()
    runner.script(ACQUIRE, Reply(8))
    assert await lock.try_lock(lease=LEASE)
    assert runner.named(ACQUIRE)[-1].args[1] != ID


@pytest.mark.parametrize(
    ("uptime", "kept"),
    [(100, True), (2, False)],
    ids=["up-since-the-grant", "restarted-since"],
)
async def test_a_resent_last_release_answered_not_held_asks_the_servers_uptime(
    runner: FakeRunner, lock: AsyncRLock, uptime: int, kept: bool
) -> None:
    """Rule: a resent release answered "not held" was most likely applied by its first copy,
    unless the server restarted without the hold in between: the client asks ``INFO server``
    and records a release only if the server has been up since the hold was last confirmed,
    else a loss."""
    await hold(lock, runner)
    await asyncio.sleep(5)  # released 5 s after its grant, well within its lease
    runner.script(HDEL, Resent(Reply(0)))  # the first copy ended the hold: the resend finds none
    runner.answer("INFO", f"# Server\r\nuptime_in_seconds:{uptime}\r\n")
    if kept:
        await lock.unlock()
    else:
        with pytest.raises(LockNotOwnedError):  # it was lost before the release
            await lock.unlock()
    assert [sent.name for sent in runner.sent[1:]] == [HDEL, HDEL, "INFO"]
    assert lock.statistics().lost is not kept
    assert held_count(lock) == 0


# -- voids ----------------------------------------------------------------------------------------


async def test_a_void_that_fails_is_logged_and_the_release_goes_on(
    runner: FakeRunner, lock: AsyncRLock, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a void that fails is logged and its caller goes on: the lease still bounds a hold
    a late copy could make."""
    runner.script(ACQUIRE, Resent(Reply(7)))
    assert await lock.try_lock(lease=LEASE)
    runner.script(VOID, Fail(RedisConnectionError("dropped")))
    runner.answer(RELEASE, 0)
    await lock.unlock()
    assert [sent.name for sent in runner.sent[2:]] == [VOID, RELEASE]
    assert "could not void 1 resent acquire(s) of 'orders'" in caplog.text
    assert held_count(lock) == 0


async def test_a_lost_hold_whose_acquire_was_resent_is_voided(
    runner: FakeRunner, lock: AsyncRLock
) -> None:
    """Rule: a hold whose acquires were resent and that is lost (its lease ran out) has no
    release to void them: they are voided then, in the background."""
    runner.script(ACQUIRE, Resent(Reply(7)))
    assert await lock.try_lock(lease=1.0)
    runner.answer(VOID, 1)
    await asyncio.sleep(1.0)
    await settled(lock)
    assert lock.statistics().lost
    [void] = runner.named(VOID)
    assert void.args == (ID, WINDOW_MS, request_of(runner.named(ACQUIRE)[0]))


# -- closing --------------------------------------------------------------------------------------


async def test_a_settlement_stops_resending_once_the_client_closed(
    runner: FakeRunner, services: Services, lock: AsyncRLock
) -> None:
    """Rule: a settlement resends until it lands, the lease surely ran out, or the client
    closed: its connections are gone."""
    runner.script(ACQUIRE, Fail(RedisConnectionError("dropped")))
    runner.always(RELEASE, Fail(RedisConnectionError("down")))
    with pytest.raises(RedisConnectionError):
        await lock.try_lock(lease=LEASE)
    await asyncio.sleep(0.05)  # two tries (at 0 and 20 ms) failed
    services.closed = True
    began = now()
    await settled(lock)
    assert now() - began < 0.1  # not the lease and its margin
    assert len(runner.named(RELEASE)) == 2  # no try after the backoff it was sleeping


# -- counts ---------------------------------------------------------------------------------------


async def test_a_release_that_leaves_holds_the_client_never_knew_of_drops_them(
    runner: FakeRunner, lock: AsyncRLock, caplog: pytest.LogCaptureFixture
) -> None:
    """Rule: a release that leaves more holds than the client knew of is a bug signal (an
    error in the log) unless a settlement gave up on that hold lately; either way the unknown
    holds are released in the background."""
    await hold(lock, runner, count=2)
    runner.script(RELEASE, Reply(3), Reply(2), Reply(1))
    with caplog.at_level(logging.WARNING, "aiolock.lock"):
        assert await lock.release_one(ID) == 3
        await settled(lock)
    [record] = [r for r in caplog.records if "did not know of" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert len(runner.named(RELEASE)) == 3  # the release, and the two holds nobody knew of
    assert held_count(lock) == 1
