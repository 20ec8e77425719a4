"""The hold registry (no Redis involved): background releases that gave up, pending work, and
the timer of a re-entered hold."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolock._core import pending as _pending
from aiolock._core.holds import Holds, NameCounters

pytestmark = pytest.mark.anyio


async def test_a_give_up_is_remembered_once_per_lock_and_owner() -> None:
    holds = Holds()
    holds.abandoned("lock:a", "owner-1")
    assert not holds.was_abandoned("lock:a", "owner-2")
    assert not holds.was_abandoned("lock:b", "owner-1")
    assert holds.was_abandoned("lock:a", "owner-1")
    assert not holds.was_abandoned("lock:a", "owner-1")  # used up


async def test_a_withdraw_given_up_is_not_a_release_given_up() -> None:
    """The fair lock's withdraws and every kind's releases keep their records apart, on the
    same lock key."""
    holds = Holds()
    holds.abandoned("lock:a", "owner-1", "withdraw")
    assert not holds.was_abandoned("lock:a", "owner-1")
    assert holds.was_abandoned("lock:a", "owner-1", "withdraw")


async def test_old_give_ups_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    holds = Holds()
    for owner in range(100):  # owners that never come back
        holds.abandoned("lock", f"owner-{owner}")
    # Later than ABANDONED_FOR: the next record drops every older one, and none explains a
    # hold met now.
    monkeypatch.setattr(_pending, "ABANDONED_FOR", -1.0)
    holds.abandoned("lock", "last")
    assert len(holds._abandoned) == 1
    assert not holds.was_abandoned("lock", "last")


async def test_a_resent_release_is_kept_for_the_resend_window() -> None:
    """The id of a release that was resent is kept for the window (the owner's acquires carry
    it), then dropped: nothing is kept for long, and nothing without a fault."""
    holds = Holds()
    assert holds.late_releases("lock", "owner") == []
    holds.resent_release("lock", "owner", 7, 0.05)
    holds.resent_release("lock", "owner", 9, 0.05)
    holds.resent_release("lock", "owner", 9, 0.05)
    assert holds.late_releases("lock", "owner") == [7, 9]
    assert holds.late_releases("lock", "other") == []
    assert holds.late_releases("other", "owner") == []
    await asyncio.sleep(0.1)
    assert holds.late_releases("lock", "owner") == []
    assert holds._late == {}
    holds.resent_release("lock", "owner", 11, 60)
    holds.clear()
    assert holds._late == {}


async def test_deferred_work_that_settles_its_own_lock_and_owner_fails_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Work deferred for a (key, owner) that waits for that settlement would wait for itself:
    ``settle`` raises instead, and the owner's next call is not held up."""
    holds = Holds()
    raised: list[BaseException] = []

    async def settles_itself() -> None:
        try:
            await holds.wait_pending("lock", "owner")
        except RuntimeError as exc:
            raised.append(exc)
            raise

    holds.defer("lock", "owner", settles_itself())
    await asyncio.wait_for(holds.wait_pending("lock", "owner"), timeout=5)
    assert len(raised) == 1
    assert "waits for its own settlement" in str(raised[0])
    assert "'owner'" in str(raised[0])
    assert "'lock'" in str(raised[0])
    assert "waits for its own settlement" in caplog.text  # the failure is logged


async def test_a_task_started_by_deferred_work_keeps_the_rule() -> None:
    """A task the deferred work starts and awaits is part of it: the same check applies."""
    holds = Holds()
    raised: list[BaseException] = []

    async def through_a_task() -> None:
        try:
            await asyncio.ensure_future(holds.wait_pending("lock", "owner"))
        except RuntimeError as exc:
            raised.append(exc)

    holds.defer("lock", "owner", through_a_task())
    await asyncio.wait_for(holds.wait_pending("lock", "owner"), timeout=5)
    assert len(raised) == 1


async def test_deferred_work_may_settle_other_locks_and_owners_and_defer_more() -> None:
    holds = Holds()
    done: list[str] = []

    async def other() -> None:
        done.append("other")

    async def more() -> None:
        done.append("more")

    async def work() -> None:
        holds.defer("lock", "other-owner", other())
        await holds.wait_pending("lock", "other-owner")  # another owner's: no cycle
        await holds.wait_pending("other-lock", "owner")  # nothing pending: returns at once
        holds.defer("lock", "owner", more())  # runs after this work
        done.append("work")

    holds.defer("lock", "owner", work())
    await asyncio.wait_for(holds.wait_pending("lock", "owner"), timeout=5)
    assert done == ["other", "work", "more"]
    assert holds.pending() == []


async def test_an_alias_waits_for_the_owners_earlier_ids_and_keeps_the_rule() -> None:
    """The id an owner goes by after a plain release with an unknown outcome waits for the work
    of its earlier ids (the release being completed under the id it ended); that work waiting
    for the alias would wait for itself, and raises."""
    holds = Holds()
    gate = asyncio.Event()
    order: list[str] = []

    async def completing() -> None:
        await gate.wait()
        order.append("completed")

    holds.defer("lock", "c:x:me", completing())
    holds.realias("lock", "c:x:me", 5, 60)
    alias = holds.alias("lock", "c:x:me")
    assert alias == "c:a5:x:me"

    async def next_acquire() -> None:
        await holds.wait_pending("lock", alias)
        order.append("acquire")

    waiting = asyncio.create_task(next_acquire())
    await asyncio.sleep(0)
    assert order == []
    gate.set()
    await asyncio.wait_for(waiting, 5)
    assert order == ["completed", "acquire"]

    raised: list[BaseException] = []

    async def settles_its_alias() -> None:
        try:
            await holds.wait_pending("lock", alias)
        except RuntimeError as exc:
            raised.append(exc)

    holds.defer("lock", "c:x:me", settles_its_alias())
    await asyncio.wait_for(holds.wait_pending("lock", "c:x:me"), 5)
    assert len(raised) == 1
    holds.clear()


async def test_a_hold_re_entered_as_its_first_lease_runs_out_keeps_the_new_lease() -> None:
    """The reply of a re-entry is read in the very pass in which the first lease's timer comes
    due: the re-entry moves the timer at once, so that timer takes nothing for lost (a fresh
    hold's timer is armed a pass after its grant; a re-entered one's must not wait)."""
    loop = asyncio.get_running_loop()
    holds = Holds()
    fields: dict[str, Any] = dict(
        name="n", kind="lock", registry_key="k", lock_key="k", owner="o", started=loop.time(),
        watchdog=False, counters=NameCounters(), task=None, renew=None, renew_keys=(),
        channels=(),
    )  # fmt: skip
    hold = holds.record_grant(reply=[7, 1, 200], sent_at=loop.time(), **fields)
    reentered = asyncio.Event()

    def reenter() -> None:  # scheduled before the first lease's timer, due at the same moment
        holds.record_grant(reply=[7, 2, 1000], sent_at=loop.time() - 0.05, **fields)
        reentered.set()

    loop.call_at(hold.expires_at, reenter)
    await reentered.wait()
    await asyncio.sleep(0)  # a timer due in that pass has run by now
    assert not hold.lost
    assert hold.count == 2
    assert hold.expires_at > loop.time() + 0.5
    assert not hold.check_lost()
