"""The hold registry's record of background releases that gave up (no Redis involved)."""

from __future__ import annotations

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
