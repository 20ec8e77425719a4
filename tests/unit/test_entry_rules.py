"""The pub/sub entry's rules that ``test_entry.py`` leaves out, on the virtual clock (no server).

``test_entry.py`` covers wake-one, kept wake-ups, the one timer and its deadlines, cancellation
and compaction; these are the remaining rules of :class:`~aiolock._redis.pubsub.Entry`'s
docstring: the permits invariant restored when a task leaves, a wake-up out of turn, and a
broadcast entry's waiters keeping their own deadlines.  Deadlines here are seconds long and
take no wall time (:mod:`tests.unit.virtual_clock`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from aiolock._redis.entry import BroadcastEntry, Entry
from tests.unit.virtual_clock import VirtualClockLoop

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"loop_factory": VirtualClockLoop}


async def test_a_task_that_leaves_takes_the_permit_kept_for_it_along() -> None:
    """Invariant: no more permits than tasks that may park; restored by ``trim`` when one
    leaves (the caller lowers ``refs`` first, as ``PubSub.unreference`` does)."""
    entry = Entry(b"channel")
    entry.refs = 2
    entry.wake_one()
    entry.wake_one()
    entry.wake_one()
    assert entry.permits == 2
    entry.refs -= 1
    entry.trim()
    assert entry.permits == 1
    assert entry.park(math.inf).result() is True
    assert not entry.park(math.inf).done()


async def test_a_wake_up_out_of_turn_wakes_that_waiter_only() -> None:
    """Another call of its owner got the lock: that waiter is woken at once, whatever its place,
    and the next release still wakes the first in line."""
    entry = Entry(b"channel")
    entry.refs = 3
    first, second, third = (entry.park(math.inf, ticket) for ticket in (1, 2, 3))
    entry.wake(second)
    assert second.result() is True
    assert not first.done()
    assert not third.done()
    assert entry.parked == 2
    entry.wake(second)  # once only
    assert entry.parked == 2
    entry.wake_one()
    assert first.result() is True
    assert not third.done()


async def test_a_broadcast_entrys_waiters_keep_their_own_deadlines() -> None:
    """Every waiter of a broadcast entry looks at the state again when its own deadline passes:
    a hold of the client does not bound them (``bound``), and one deadline passing wakes that
    waiter alone."""
    entry = BroadcastEntry(b"channel")
    entry.refs = 2
    loop = asyncio.get_running_loop()
    began = loop.time()
    soon, later = entry.park(began + 5), entry.park(began + 10)
    entry.bound(began + 1)
    await asyncio.sleep(2)
    assert not soon.done()
    assert await soon is False
    assert loop.time() == pytest.approx(began + 5)
    assert not later.done()
    assert await later is False
    assert loop.time() == pytest.approx(began + 10)
    assert entry.parked == 0
