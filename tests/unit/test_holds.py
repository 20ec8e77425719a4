"""The hold registry's record of background releases that gave up (no Redis involved)."""

from __future__ import annotations

import asyncio

import pytest

from aiolock._core import holds as _holds
from aiolock._core.holds import Holds

pytestmark = pytest.mark.anyio


async def test_a_give_up_is_remembered_once_per_lock_and_owner() -> None:
    holds = Holds()
    holds.abandoned("lock:a", "owner-1")
    assert not holds.was_abandoned("lock:a", "owner-2")
    assert not holds.was_abandoned("lock:b", "owner-1")
    assert holds.was_abandoned("lock:a", "owner-1")
    assert not holds.was_abandoned("lock:a", "owner-1")  # used up


async def test_old_give_ups_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    holds = Holds()
    for owner in range(100):  # owners that never come back
        holds.abandoned("lock", f"owner-{owner}")
    # Later than ABANDONED_FOR: the next record drops every older one, and none explains a
    # hold met now.
    monkeypatch.setattr(_holds, "ABANDONED_FOR", -1.0)
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
