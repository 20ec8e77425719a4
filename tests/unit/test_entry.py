"""The pub/sub entry's parking queue: wake-ups, deadlines on one timer, cancellation (no server)."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import NoPermissionError

from aiolock._core.holds import NameCounters
from aiolock._redis.entry import BroadcastEntry, Entry
from aiolock.fair.entry import Grant, NamedCall, NamedEntry

pytestmark = pytest.mark.anyio


def make_entry(refs: int) -> Entry:
    entry = Entry(b"channel")
    entry.refs = refs
    return entry


async def test_wake_one_goes_to_the_longest_parked() -> None:
    entry = make_entry(refs=3)
    first, second = entry.park(float("inf")), entry.park(float("inf"))
    assert entry.parked == 2
    entry.wake_one()
    assert first.result() is True
    assert not second.done()
    assert entry.parked == 1


async def test_a_wake_up_with_nobody_parked_is_kept_for_the_next() -> None:
    entry = make_entry(refs=1)
    entry.wake_one()
    entry.wake_one()  # no more permits than references
    assert entry.park(float("inf")).result() is True
    assert not entry.park(float("inf")).done()


async def test_deadlines_share_one_timer_and_expire_in_order() -> None:
    entry = BroadcastEntry(b"channel")  # each waiter on its own deadline (see the next test)
    entry.refs = 3
    loop = asyncio.get_running_loop()
    now = loop.time()
    late = entry.park(now + 0.2)
    early = entry.park(now + 0.05)
    never = entry.park(float("inf"))
    assert entry._timer_at == now + 0.05  # one timer, at the earliest deadline
    assert await asyncio.wait_for(early, 5) is False
    assert not late.done()
    assert entry.parked == 2
    assert await asyncio.wait_for(late, 5) is False
    assert loop.time() >= now + 0.2 - 0.002
    assert not never.done()
    entry.wake_all()
    assert never.result() is True
    assert entry.parked == 0


async def test_when_a_deadline_passes_only_the_first_in_line_tries() -> None:
    """A deadline is the end of a lease a task met: when the first passes, one task of the
    client tries, the first in line, and the others' deadlines are dropped (that try learns
    the lease in force; the others try when woken: by a release, or by that one leaving)."""
    entry = make_entry(refs=3)
    now = asyncio.get_running_loop().time()
    first = entry.park(now + 0.2, 1)
    second = entry.park(now + 0.02, 2)  # met a shorter lease
    third = entry.park(now + 0.03, 3)
    assert await asyncio.wait_for(first, 5) is False
    assert not second.done()
    assert not third.done()
    assert entry._timer is None  # the others park on with no deadline
    assert entry.parked == 2
    entry.wake_one()
    assert second.result() is True
    assert not third.done()


async def test_a_hold_of_the_client_bounds_its_parked_waiters_by_its_lease() -> None:
    """A task of the client got the lock: those parked with no deadline (they dropped theirs
    when another tried) wait no longer than its lease, in case its release's message is lost."""
    entry = make_entry(refs=2)
    first, second = entry.park(float("inf"), 1), entry.park(float("inf"), 2)
    entry.bound(asyncio.get_running_loop().time() + 0.02)
    assert await asyncio.wait_for(first, 5) is False
    assert not second.done()


async def test_a_broadcast_entry_wakes_every_waiter_whose_deadline_passed() -> None:
    entry = BroadcastEntry(b"channel")
    entry.refs = 2
    now = asyncio.get_running_loop().time()
    readers = [entry.park(now + 0.02), entry.park(now + 0.02)]
    assert await asyncio.wait_for(asyncio.gather(*readers), 5) == [False, False]


async def test_a_cancelled_waiter_stops_counting_and_is_skipped() -> None:
    entry = make_entry(refs=2)
    gone, kept = entry.park(float("inf")), entry.park(float("inf"))
    gone.cancel()
    entry.unpark(gone)
    assert entry.parked == 1
    entry.wake_one()
    assert kept.result() is True


async def test_the_queue_of_finished_waiters_is_compacted() -> None:
    entry = make_entry(refs=1)
    for _ in range(1000):
        waiter = entry.park(float("inf"))
        waiter.cancel()
        entry.unpark(waiter)
    assert entry.parked == 0
    assert len(entry._waiters) <= 17


async def test_wake_all_wakes_every_waiter_and_arms_permits() -> None:
    entry = make_entry(refs=3)
    waiters = [entry.park(float("inf")) for _ in range(2)]
    entry.wake_all()
    assert [w.result() for w in waiters] == [True, True]
    assert entry.parked == 0
    assert entry.park(float("inf")).result() is True  # a permit for the one not parked yet


async def test_a_waiter_that_was_ahead_parks_first() -> None:
    entry = make_entry(refs=3)
    queued = entry.park(float("inf"), 2)
    ahead = entry.park(float("inf"), 1)
    entry.wake_one()
    assert ahead.result() is True
    assert not queued.done()


async def test_waiters_woken_together_re_park_in_their_order() -> None:
    """After a reconnect wakes everyone, the losers' tries come back in any order: they are
    queued by ticket again, not by who re-parked first."""
    entry = make_entry(refs=3)
    for ticket in (1, 2, 3):
        entry.park(float("inf"), ticket)
    entry.wake_all()
    assert entry.parked == 0
    parked = {ticket: entry.park(float("inf"), ticket) for ticket in (3, 1, 2)}
    served = []
    for _ in range(3):
        entry.wake_one()
        served += [t for t, w in parked.items() if w.done() and t not in served]
    assert served == [1, 2, 3]


async def test_a_wake_up_is_kept_while_a_woken_task_is_out_trying() -> None:
    """Waking a second task while the first is still trying would put two on the lock."""
    counters = NameCounters(contenders=3, waiters=3)
    entry = Entry(b"channel", counters)
    entry.refs = 3
    first, second, third = (entry.park(float("inf"), t) for t in (1, 2, 3))
    entry.wake_one()
    assert first.result() is True  # first is out trying now
    entry.wake_one()  # another release meanwhile: kept for first, not handed to second
    assert not second.done()
    again = entry.park(float("inf"), 1)  # first's try failed: it uses the kept wake-up
    assert again.result() is True
    assert not second.done()
    assert not third.done()


async def test_a_wake_up_is_kept_for_a_task_on_its_first_try() -> None:
    """That task came before every parked one: the wake-up is its, once it parks."""
    counters = NameCounters(contenders=3, waiters=2)  # one task in the loop has not joined
    entry = Entry(b"channel", counters)
    entry.refs = 2
    queued = entry.park(float("inf"))
    entry.wake_one()
    assert not queued.done()
    counters.waiters = entry.refs = 3  # the first try failed: it joins and parks first
    first = entry.park(float("inf"), 1)
    assert first.result() is True  # at once, from the permit
    assert not queued.done()
    # It got the lock and left, and so did the other joined task: only the parked one is left.
    counters.contenders = counters.waiters = entry.refs = 1
    entry.trim()
    entry.wake_one()  # nobody out trying any more: the parked one wakes
    assert queued.result() is True


async def test_without_a_first_try_no_more_permits_than_references() -> None:
    entry = Entry(b"channel", NameCounters(contenders=1, waiters=1))
    entry.refs = 1
    entry.wake_one()
    entry.wake_one()
    assert entry.park(float("inf")).result() is True
    assert not entry.park(float("inf")).done()


async def test_the_confirmation_wakes_one_waiter() -> None:
    """A release may have been published before the subscription existed: one waiter tries."""
    entry = make_entry(refs=2)
    first, second = entry.park(float("inf")), entry.park(float("inf"))
    assert not entry.confirmed
    entry.confirm()
    assert entry.confirmed
    assert first.result() is True
    assert not second.done()


async def test_a_refused_entry_wakes_everyone_and_each_raises_a_copy() -> None:
    entry = make_entry(refs=2)
    waiters = [entry.park(float("inf")), entry.park(float("inf"))]
    refusal = NoPermissionError("this user has no permissions to access one of the channels")
    entry.refuse(refusal)
    assert [waiter.result() for waiter in waiters] == [True, True]
    assert entry.parked == 0
    raised = []
    for _ in waiters:  # one copy per waiting task: tracebacks do not pile up on one object
        with pytest.raises(NoPermissionError, match="no permissions") as caught:
            entry.raise_refusal()
        raised.append(caught.value)
    assert raised[0] is not raised[1]
    assert all(copy is not refusal for copy in raised)


async def test_an_entry_not_refused_raises_nothing() -> None:
    entry = make_entry(refs=1)
    entry.raise_refusal()


async def test_wake_all_leaves_a_cancelled_waiter_to_unpark() -> None:
    """A waiter cancelled before wake_all, whose task has not run ``unpark`` yet, counts once."""
    entry = make_entry(refs=2)
    gone, kept = entry.park(float("inf")), entry.park(float("inf"))
    gone.cancel()
    entry.wake_all()
    entry.unpark(gone)
    assert kept.result() is True
    assert entry.parked == 0


async def test_a_wake_up_kept_for_a_first_try_that_was_granted_is_dropped() -> None:
    counters = NameCounters(contenders=2, waiters=1)  # one parked, one on its first try
    entry = Entry(b"channel", counters)
    entry.refs = 1
    parked = entry.park(float("inf"))
    entry.wake_one()  # kept for the first try
    counters.contenders = 1  # that try was granted: it leaves without parking
    entry.drop_wakeups()
    assert not parked.done()  # the lock is held now: waking it would be an empty try
    assert not entry.park(float("inf")).done()  # and no stale wake-up is left for the next


async def test_a_bound_message_ends_the_named_park_by_then_and_nothing_else() -> None:
    # '+<ms> <owner>': the hold in front of that owner ends within ms (a fair lock grant told
    # the next in line): a parked owner wakes by then, one between parks at its next park.
    loop = asyncio.get_running_loop()
    entry = NamedEntry(b"channel")
    entry.refs = 3
    a, b, c = calls = [NamedCall(name) for name in ("a", "b", "c")]
    for call in calls:
        entry.add(call)
    parked = entry.park_named(a, float("inf"))
    sent = loop.time()
    entry.deliver(b"+30 a")
    entry.deliver(b"+40 b")  # b is between two tries
    entry.deliver(b"+10 nobody")  # not waiting here: ignored
    for foreign in (b"+", b"+x a", b"+-5 a", b"+1.5 a", b"\xff"):  # published by someone else
        entry.deliver(foreign)  # wakes nobody: no owner waiting here has that name
    assert not parked.done()
    assert await asyncio.wait_for(parked, 5) is False  # ended by the bound, not woken
    assert loop.time() - sent >= 0.03 - 0.002  # the loop's clock resolution
    assert entry.parked == 0
    later = entry.park_named(b, float("inf"))
    assert await asyncio.wait_for(later, 5) is False
    assert loop.time() - sent >= 0.04 - 0.002

    # A bound for a waiter woken meanwhile does not end its next park.
    first = entry.park_named(a, float("inf"))
    entry.deliver(b"+20 a")
    entry.deliver(b"a")  # the hand-off itself
    assert first.result() is True
    again = entry.park_named(a, float("inf"))
    witness = entry.park_named(c, float("inf"))
    entry.deliver(b"+40 c")
    assert await asyncio.wait_for(witness, 5) is False  # past a's old bound
    assert not again.done()
    assert entry.parked == 1
    entry.discard(a)


async def test_each_call_of_an_owner_keeps_its_own_park() -> None:
    # Two tasks share an explicit owner: a message naming it wakes both, a grant is kept until
    # one takes it, and the first to leave does not take the owner's name away from the other.
    entry = NamedEntry(b"channel")
    entry.refs = 2
    one, two = NamedCall("o"), NamedCall("o")
    entry.add(one)
    entry.add(two)
    first = entry.park_named(one, float("inf"))
    second = entry.park_named(two, float("inf"))
    entry.deliver(b"=7 1000 5 3 o")
    assert first.result() is True
    assert second.result() is True
    assert entry.take_grant("o") == Grant(7, 1000, 5, 3)
    assert entry.take_grant("o") is None
    entry.discard(one)
    assert entry.names() == ["o"]
    again = entry.park_named(two, float("inf"))
    entry.wake_all()  # the client closes
    assert again.result() is True
    entry.discard(two)
    assert entry.names() == []
