"""The wait strategies (``aiolock._core.waiting``, the fair lock's ``aiolock.fair.waiting``) on
their own, with no server.

Each strategy runs against the real pub/sub service and its real entries; only the server is
missing: the topology never says where a channel lives, so every SUBSCRIBE stays pending and
nothing is sent.  The services are a stand-in with the five things a strategy reads (the
watchdog lease, the pub/sub service, the owners' request ids, ``closed`` and ``check_open``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import NoPermissionError

from aiolock._core.clock import DRIFT, ServerClock
from aiolock._core.holds import NameCounters
from aiolock._core.line import ClientWait, Line
from aiolock._core.owners import Owners
from aiolock._core.waiting import Backoff, ChannelWait
from aiolock._redis.pubsub import Home, PubSub
from aiolock.fair.entry import Grant, NamedEntry
from aiolock.fair.waiting import NamedWait, Turns

pytestmark = pytest.mark.anyio

CHANNEL = "{lock}:channel"
WATCHDOG = 30.0


class _NoServer:
    """A topology that never finds the channel's node: SUBSCRIBEs wait, none is sent."""

    sharded = False

    async def ready(self) -> None:
        await asyncio.Event().wait()

    async def refresh(self) -> None:
        await asyncio.Event().wait()

    def home(self, channel: bytes) -> Home:  # pragma: no cover - ready() never returns
        raise AssertionError("no node is ever asked for")


class _Services:
    """What a strategy uses of a client's services, and nothing else."""

    def __init__(self, pubsub: PubSub) -> None:
        self.pubsub = pubsub
        self.owners = Owners("c")
        self.watchdog_timeout = WATCHDOG
        self.closed = False

    def check_open(self) -> _Services:
        if self.closed:
            raise RuntimeError("the aiolock client is closed")
        return self


class _Watch:
    """Records what a fair waiter asks of the keep-alive."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add(self, entry: NamedEntry) -> None:
        self.calls.append(f"add {sorted(entry.names())}")

    def discard(self) -> None:
        self.calls.append("discard")

    def turn(self) -> None:
        return None

    def tried(self) -> None:
        pass

    def begin(self, owner: str) -> None:
        self.calls.append(f"begin {owner}")

    def end(self, owner: str) -> None:
        self.calls.append(f"end {owner}")


@pytest.fixture
async def services() -> AsyncIterator[Any]:
    pubsub = PubSub(_NoServer(), concurrency=1)
    try:
        yield _Services(pubsub)
    finally:
        await pubsub.aclose()


def channel_wait(services: Any, counters: NameCounters, **options: Any) -> ChannelWait:
    return ChannelWait(services, CHANNEL, counters, reentering=False, **options)


def entry_of(services: Any) -> Any:
    """The channel's entry, without taking a reference (``join_existing`` would add one)."""
    return services.pubsub.entries.get(CHANNEL.encode())


# -- ChannelWait: the plain lock's FIFO among this client's tasks --------------------------------


async def test_the_first_contender_tries_at_once_and_a_newcomer_queues(services: Any) -> None:
    counters = NameCounters()
    first = channel_wait(services, counters)
    assert first.first_pause() is None
    newcomer = channel_wait(services, counters)
    assert newcomer.first_pause() == WATCHDOG  # behind the first: parks before it tries
    reentering = ChannelWait(services, CHANNEL, counters, reentering=True)
    assert reentering.first_pause() is None  # never behind its own waiters
    assert counters.contenders == 3
    for wait in (first, newcomer, reentering):
        wait.leave(granted=False)
    assert counters.contenders == 0


async def test_channel_waiters_are_counted_from_their_first_park_until_they_leave(
    services: Any,
) -> None:
    counters = NameCounters()
    wait = channel_wait(services, counters)
    assert (counters.contenders, counters.waiters, counters.first_tries) == (1, 0, 1)
    assert entry_of(services) is None  # no subscription for a task on its first try
    waiter = wait.park(60)
    assert (counters.waiters, counters.first_tries) == (1, 0)
    entry = entry_of(services)
    assert entry is not None
    assert entry.refs == 1
    assert entry.parked == 1
    entry.wake_one()
    assert waiter.result() is True
    wait.park(60)  # a second park joins no second time
    assert (counters.waiters, entry.refs) == (1, 1)
    wait.leave(granted=True)
    assert (counters.contenders, counters.waiters, entry.refs) == (0, 0, 0)


async def test_a_nudge_wakes_a_parked_channel_waiter_or_its_next_park_once(
    services: Any,
) -> None:
    # Another call of the waiter's owner got the lock: the waiter tries at once (a reentrant
    # grant), and a nudge between two parks ends only the next park, not every later one.
    counters = NameCounters()
    wait = channel_wait(services, counters)
    waiter = wait.park(60)
    wait.nudge()
    assert waiter.result() is True
    assert entry_of(services).parked == 0
    wait.nudge()  # between two parks
    assert wait.park(60).result() is True
    assert not wait.park(60).done()  # parked again: nothing else to try for
    wait.leave(granted=False)


async def test_channel_waiters_are_woken_in_the_order_they_entered(services: Any) -> None:
    counters = NameCounters()
    waits = [channel_wait(services, counters) for _ in range(3)]
    # Their tries came back in reverse order: they park in reverse, yet wake in entry order.
    parked = {index: waits[index].park(60) for index in (2, 1, 0)}
    entry = entry_of(services)
    for expected in (0, 1, 2):
        entry.wake_one()
        assert [index for index, waiter in parked.items() if waiter.done()] == [expected]
        waits[expected].leave(granted=True)  # it got the lock, and is done with it
        del parked[expected]


async def test_a_channel_waiter_leaving_without_the_lock_wakes_the_next(services: Any) -> None:
    counters = NameCounters()
    first, second = channel_wait(services, counters), channel_wait(services, counters)
    first_waiter, second_waiter = first.park(60), second.park(60)
    entry_of(services).wake_one()
    assert first_waiter.result() is True
    assert not second_waiter.done()
    first.leave(granted=False)  # woken, but gives up (its deadline passed, say)
    assert second_waiter.result() is True  # the wake-up is not lost
    second.leave(granted=True)


async def test_a_wake_up_kept_while_the_head_tries_is_dropped_when_it_wins(
    services: Any,
) -> None:
    counters = NameCounters()
    head, queued = channel_wait(services, counters), channel_wait(services, counters)
    head.park(60)
    waiter = queued.park(60)
    entry = entry_of(services)
    entry.wake_one()  # the head is woken and goes to try
    entry.wake_one()  # a release while it tries: kept, not handed past the head
    assert not waiter.done()
    head.leave(granted=True)  # it got the lock: the next would only find it held
    assert not waiter.done()
    queued.leave(granted=False)
    again = channel_wait(services, counters)
    assert not again.park(60).done()  # the kept wake-up was dropped, not left for later
    again.leave(granted=False)


async def test_a_permit_holder_passes_the_turn_on(services: Any) -> None:
    counters = NameCounters()
    holder = channel_wait(services, counters, shared=True)
    queued = channel_wait(services, counters, shared=True)
    holder.park(60)
    waiter = queued.park(60)
    entry_of(services).wake_one()  # the holder goes to try
    assert not waiter.done()
    holder.leave(granted=True)  # a permit taken: another may be free, the next one tries
    assert waiter.result() is True
    queued.leave(granted=True)


async def test_a_refused_channel_or_a_closed_client_ends_the_wait(services: Any) -> None:
    counters = NameCounters()
    wait = channel_wait(services, counters)
    waiter = wait.park(60)
    wait.woken()  # nothing wrong yet: no error
    entry_of(services).refuse(NoPermissionError("no permissions to access a channel"))
    assert waiter.result() is True  # the refusal wakes it, to raise
    with pytest.raises(NoPermissionError):
        wait.woken()
    wait.leave(granted=False)
    closing = channel_wait(services, NameCounters())
    services.closed = True
    with pytest.raises(RuntimeError, match="closed"):
        closing.woken()
    closing.leave(granted=False)


# -- NamedWait: the fair lock's hand-off names the one waiter it wakes -------------------------


async def test_a_named_waiter_joins_an_existing_entry_before_its_first_try(services: Any) -> None:
    counters = NameCounters()
    first = NamedWait(services, CHANNEL, counters, "owner-a")
    assert first.first_pause() is None
    assert entry_of(services) is None
    assert counters.waiters == 0
    first.park(60)
    entry = entry_of(services)
    assert isinstance(entry, NamedEntry)
    assert entry.refs == 1
    assert counters.waiters == 1
    # A second owner registers at once: a hand-off naming it during its first try is kept.
    second = NamedWait(services, CHANNEL, counters, "owner-b")
    assert (entry.refs, counters.waiters, counters.contenders) == (2, 2, 2)
    entry.deliver(b"owner-b")  # handed the lock while its try is out
    assert second.park(60).result() is True  # its next park returns at once
    for wait in (first, second):
        wait.leave(granted=False)
    assert (entry.refs, counters.waiters, counters.contenders) == (0, 0, 0)


async def test_a_hand_off_wakes_only_the_owner_it_names(services: Any) -> None:
    counters = NameCounters()
    watch = _Watch()
    waits = {name: NamedWait(services, CHANNEL, counters, name, watch) for name in "abc"}
    parked = {name: wait.park(60) for name, wait in waits.items()}
    entry = entry_of(services)
    entry.deliver(b"b")
    assert [name for name, waiter in parked.items() if waiter.done()] == ["b"]
    assert parked["b"].result() is True
    entry.deliver(b"nobody-here")  # a hand-off to another client's waiter: none woken here
    assert [name for name, waiter in parked.items() if waiter.done()] == ["b"]
    entry.wake_named("c")  # its place in the queue was lost (the watch): it tries again now
    assert parked["c"].result() is True
    assert not parked["a"].done()
    waits["b"].park(60)  # parks again: counted once
    for wait in waits.values():
        wait.leave(granted=False)
    # Each call is counted from its start to its end, and each waiter from its first park to
    # its leaving; the watch reads their names from the entry they park on.
    assert watch.calls == [
        "begin a",
        "begin b",
        "begin c",
        "add ['a']",
        "add ['a', 'b']",
        "add ['a', 'b', 'c']",
        "end a",
        "discard",
        "end b",
        "discard",
        "end c",
        "discard",
    ]
    assert (counters.contenders, counters.waiters, entry.refs) == (0, 0, 0)


async def test_a_named_waiter_leaving_forgets_its_name(services: Any) -> None:
    counters = NameCounters()
    gone, staying = (NamedWait(services, CHANNEL, counters, name) for name in ("gone", "staying"))
    gone.park(60)
    waiter = staying.park(60)
    gone.leave(granted=False)
    entry = entry_of(services)
    entry.deliver(b"gone")  # a hand-off to the owner that left: nothing is kept for it
    assert not waiter.done()
    again = NamedWait(services, CHANNEL, counters, "gone")  # the same owner comes back
    assert not again.park(60).done()  # no stale wake-up from before
    for wait in (staying, again):
        wait.leave(granted=False)


async def test_a_grant_message_wakes_its_owner_and_is_handed_to_the_wait_loop(
    services: Any,
) -> None:
    counters = NameCounters()
    waits = {name: NamedWait(services, CHANNEL, counters, name) for name in ("a", "b c")}
    request = services.owners.next_request()  # the waiters' tries come after they began
    parked = {name: wait.park(60) for name, wait in waits.items()}
    entry = entry_of(services)
    entry.deliver(f"=7 2000 1700000000123 {request} b c".encode())  # an owner with a space
    assert [name for name, waiter in parked.items() if waiter.done()] == ["b c"]
    assert waits["b c"].woken() == Grant(7, 2000, 1700000000123, request)
    assert waits["b c"].woken() is None  # taken once
    entry.deliver(f"=8 2000 1 {request} nobody-here".encode())  # not waiting here: dropped
    entry.deliver(b"=9 2000 junk 1 a")  # malformed: dropped
    assert not parked["a"].done()
    for wait in waits.values():
        wait.leave(granted=False)


async def test_a_grant_arriving_between_two_parks_is_kept_and_a_stale_one_dropped(
    services: Any,
) -> None:
    counters = NameCounters()
    earlier = services.owners.next_request()  # a try of an earlier wait of the same owner
    wait = NamedWait(services, CHANNEL, counters, "a")
    wait.park(60).cancel()
    entry = entry_of(services)
    entry.deliver(f"=3 1000 5 {earlier} a".encode())  # from before this wait: stale
    assert wait.park(60).result() is True  # it still wakes it: a try then finds out
    assert wait.woken() is None
    request = services.owners.next_request()
    entry.deliver(f"=4 1000 5 {request} a".encode())  # while its try is out
    assert wait.park(60).result() is True  # its next park returns at once
    assert wait.woken() == Grant(4, 1000, 5, request)
    wait.leave(granted=False)


def test_the_server_clock_maps_server_time_to_an_earlier_loop_time() -> None:
    clock = ServerClock()
    assert clock.lower_bound(5_000, now=10.0) is None  # no sample: no bound
    clock.sample(sent_at=10.0, server_ms=1_000, read_at=10.002)  # read within [10, 10.002]
    # Read in whole ms, rounded down: 1.000 may have been 1.000999, and 1.500 exactly.
    assert clock.lower_bound(1_500, now=10.0) == pytest.approx(10.499)
    # Aged for clock drift: a second later, the bound is a millisecond earlier.
    assert clock.lower_bound(1_500, now=11.0) == pytest.approx(10.499 - DRIFT)
    clock.sample(sent_at=20.0, server_ms=9_000, read_at=20.001)  # the latest replaces it
    assert clock.lower_bound(9_000, now=20.0) == pytest.approx(19.999)


def test_the_server_clock_bounds_the_server_time_now_from_below() -> None:
    clock = ServerClock()
    assert clock.server_ms_at_least(now=10.0) is None  # no sample: no bound
    assert clock.age(now=10.0) == math.inf
    clock.sample(sent_at=10.0, server_ms=1_000, read_at=10.002)
    # The server read 1.000 s no later than loop time 10.002: half a second after that, its
    # clock reads at least 1.500 s (aged for drift over that half second).
    assert clock.server_ms_at_least(now=10.502) == math.floor(1_500 - DRIFT * 500)
    assert clock.age(now=10.502) == pytest.approx(0.5)
    # The bound never passes what the server may read: at most 1.000999 at 10.0, so at
    # 10.502 at most ~1.503 s; the bound is below the least it may read.
    bound = clock.server_ms_at_least(now=10.502)
    assert bound is not None
    assert bound <= 1_500


# -- Backoff: the spin lock's full-jitter sleeps ------------------------------------------------


@pytest.fixture
async def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The delays a Backoff asks the event loop for, each followed by its timer handle."""
    loop = asyncio.get_running_loop()
    recorded: list[Any] = []
    call_later = loop.call_later

    def recording(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        handle = call_later(delay, callback, *args)
        recorded.extend((delay, handle))
        return handle

    monkeypatch.setattr(loop, "call_later", recording)
    return recorded


@pytest.mark.parametrize("seed", range(20))
async def test_backoff_never_sleeps_longer_than_its_delay_or_the_allowed_pause(
    services: Any, sleeps: list[Any], seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seeded draws for this test only: the process's own generator stays as it was.
    monkeypatch.setattr(random, "uniform", random.Random(seed).uniform)
    backoff = Backoff(services, NameCounters(), initial=0.01, maximum=0.5)
    pauses = [1.0, 0.003, 1.0, 0.2, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    delay = 0.01
    for pause in pauses:
        backoff.unpark(backoff.park(pause))  # each sleep asked for, then called off
        asked = sleeps[-2]
        assert 0 <= asked <= min(delay, pause), (asked, delay, pause)
        delay = min(delay * 2, 0.5)
    backoff.leave(granted=False)


async def test_backoff_doubles_to_its_maximum_and_yields_to_a_shorter_pause(
    services: Any, sleeps: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # the longest jitter
    backoff = Backoff(services, NameCounters(), initial=0.01, maximum=0.05)
    for pause in (1.0, 1.0, 0.015, 1.0, 1.0, 1.0):
        backoff.unpark(backoff.park(pause))
    assert sleeps[::2] == pytest.approx([0.01, 0.02, 0.015, 0.05, 0.05, 0.05])
    backoff.leave(granted=False)


async def test_backoff_wakes_after_its_sleep_and_its_timer_ends_with_it(
    services: Any, sleeps: list[Any]
) -> None:
    counters = NameCounters()
    backoff = Backoff(services, counters, initial=0.001, maximum=0.001)
    assert backoff.first_pause() is None
    assert (counters.contenders, counters.waiters) == (1, 0)  # a waiter from its first pause
    assert await asyncio.wait_for(backoff.park(60), 5) is True
    assert counters.waiters == 1
    pending = backoff.park(60)
    backoff.leave(granted=False)  # leaves while the next sleep runs: its timer is cancelled
    assert sleeps[-1].cancelled()
    assert not pending.done()
    assert (counters.contenders, counters.waiters) == (0, 0)
    closing = Backoff(services, NameCounters(), initial=0.1, maximum=0.1)
    closing.woken()  # open: no error
    services.closed = True
    with pytest.raises(RuntimeError, match="closed"):
        closing.woken()


# -- Turns: the fair waiters' tries in flight, bounded per client and slot -------------------------


async def test_turns_bound_the_tries_in_flight_and_pass_over_one_cancelled() -> None:
    turns = Turns(2)
    assert turns.take() is None
    assert turns.take() is None
    queued = [turns.take() for _ in range(3)]
    assert all(turn is not None and not turn.done() for turn in queued)
    third, fourth, fifth = (turn for turn in queued if turn is not None)
    third.cancel()  # its waiter left while it waited for its turn
    turns.give_back()
    assert [fourth.done(), fifth.done()] == [True, False]  # in order, the cancelled passed over
    turns.give_back()
    assert fifth.done()
    turns.give_back()  # nobody queued: the turn is free again, and so is the next
    turns.give_back()
    assert turns.take() is None
    assert turns.take() is None
    assert turns.take() is not None


# -- ClientWait in a Line: the plain lock's grants from the waiting set --------------------------


def client_wait(services: Any, counters: NameCounters, line: Line, owner: str) -> ClientWait:
    return ClientWait(
        services,
        CHANNEL,
        counters,
        reentering=False,
        line=line,
        owner=owner,
        asked_ms=5000,
        watchdog=True,
    )


async def test_a_line_enters_one_owner_per_client_and_a_grant_wakes_that_owner(
    services: Any,
) -> None:
    loop = asyncio.get_running_loop()
    line, counters = Line("c", loop.time, lambda: False), NameCounters()
    first = client_wait(services, counters, line, "c:t1")
    behind = client_wait(services, counters, line, "c:t2")
    assert first.entered <= behind.entered
    # A try of an owner with no waiting call here parks nobody: no place.
    assert line.place_for("c:t9", 6, 5000) is None
    # The first's try enters its owner, in the order of when it began to wait; a second try of
    # it carries the same member.
    assert line.place_for("c:t1", 7, 5000) == (first.entered, "5000 7 c c:t1", False)
    assert line.place_for("c:t1", 9, 5000) == (first.entered, "5000 7 c c:t1", True)
    # Until a try of it is answered, a release of this client enters that place itself.
    assert line.next_entry("c:t0", "-", 10, None, kept_ms=32000) == (
        f"{first.entered} 32000 5000 7 c c:t1"
    )
    line.refused("c:t1", loop.time())
    # A release of this client while both wait enters nobody more: an owner has a place.
    assert line.next_entry("c:t0", "-", 10, None, kept_ms=32000) == "+"
    parked = first.park(60)
    behind_parked = behind.park(60)
    # A grant to another client, or to an earlier place of this owner, wakes nobody here.
    line.deliver_grant(b"=41 5000 7 other c:t1")
    line.deliver_grant(b"=41 5000 6 c c:t1")
    assert not parked.done()
    assert first.woken() is None
    line.deliver_grant(b"=42 5000 7 c c:t1")
    assert parked.result() is True
    assert not behind_parked.done()
    grant = first.woken()
    assert grant is not None
    assert (grant.token, grant.lease_ms, grant.request) == (42, 5000, 7)
    assert first.woken() is None  # taken once
    first.granted(loop.time() + 5)
    first.leave(granted=True)
    # The holder's release enters the next call of its client, with a request id of its own.
    entry = f"{behind.entered} 32000 5000 11 c c:t2"
    assert line.next_entry("c:t1", "32000", 11, None, kept_ms=32000) == entry
    assert line.next_entry("c:t1", "-", 12, None, kept_ms=32000) == "+"
    # A release that carried it and surely entered nobody (refused): the next one enters it.
    line.not_entered(entry)
    assert line.next_entry("c:t1", "-", 12, None, kept_ms=32000) == entry
    assert line.next_entry("c:t1", "-", 12, None, kept_ms=32000) == "+"
    # A release that keeps the set alive enters that place again (the set may have expired
    # while its call waited silently behind this client's hold).
    assert (
        line.next_entry("c:t1", "32000", 12, None, kept_ms=32000)
        == f"{behind.entered} 32000 5000 11 c c:t2"
    )
    # A release of a hold last found on the server at loop time ``found``, token 50: a grant to
    # the place comes after both, and the message of one with a lesser token is stale.
    found = loop.time() + 100
    assert line.next_entry("c:t1", "-", 12, (found, 50), kept_ms=32000) == "+"
    line.deliver_grant(b"=49 5000 11 c c:t2")
    assert not behind_parked.done()
    line.deliver_grant(b"=51 5000 11 c c:t2")
    assert behind_parked.result() is True
    grant = behind.woken()
    assert grant is not None
    assert (grant.token, grant.since) == (51, found)
    assert line.withdraw("c:t2") == "5000 11 c c:t2"  # gives up: its member to withdraw
    assert line.withdraw("c:t2") is None
    behind.leave(granted=False)
    assert line.next_entry("c:t1", "-", 13, None, kept_ms=32000) == ""  # nobody waits behind


async def test_a_withdraw_waits_for_the_releases_in_flight_that_enter_its_owner_again(
    services: Any,
) -> None:
    loop = asyncio.get_running_loop()
    line, counters = Line("c", loop.time, lambda: False), NameCounters()
    waiter = client_wait(services, counters, line, "c:t2")
    # Two releases of this client's holder are computed, each entering the waiting call.
    first = line.next_entry("c:t1", "32000", 11, None, kept_ms=32000)
    second = line.next_entry("c:t1", "32000", 12, None, kept_ms=32000)
    member = "5000 11 c c:t2"
    assert first == second == f"{waiter.entered} 32000 {member}"
    # Its wait runs out: the withdraw waits for both (sent first, it would find nothing, and
    # they would then grant the lock to a member nobody waits as).
    assert line.withdraw("c:t2") == member
    waiter.leave(granted=False)
    out = line.after_carried(member)
    assert out is not None
    assert line.after_carried(member) is out  # one for every withdraw of it
    line.carried(first)
    assert not out.done()
    line.carried("+")  # one that entered nobody settles nothing
    line.carried(second)
    assert out.done()
    assert line.after_carried(member) is None  # nothing in flight enters it now
    line.carried(second)  # settled twice (a fault path): nothing more


async def test_a_grant_taken_from_a_release_reply_makes_its_message_stale(
    services: Any,
) -> None:
    loop = asyncio.get_running_loop()
    line, counters = Line("c", loop.time, lambda: False), NameCounters()
    waiter = client_wait(services, counters, line, "c:t1")
    assert line.place_for("c:t1", 7, 5000) == (waiter.entered, "5000 7 c c:t1", False)
    parked = waiter.park(60)
    assert line.deliver_grant(b"=42 5000 7 c c:t1", from_reply=True)
    assert parked.result() is True
    grant = waiter.woken()
    assert grant is not None
    assert grant.token == 42
    # The message of the same grant, arriving after, hands nothing again.
    parked = waiter.park(60)
    line.deliver_grant(b"=42 5000 7 c c:t1")
    assert not parked.done()
    assert waiter.woken() is None
    waiter.unpark(parked)
    waiter.leave(granted=False)


def refused(line: Line, call: ClientWait, request: int) -> None:
    """``call``'s try with ``request`` entered its owner in the set, and was refused."""
    place = line.place_for(call.owner, request, call.lease_ms)
    assert place == (call.entered, f"{call.lease_ms} {request} c {call.owner}", False)
    line.refused(call.owner, asyncio.get_running_loop().time())


def refused_call(services: Any) -> tuple[Line, NameCounters, ClientWait]:
    """A line of client ``c`` whose one call, of ``c:h1``, had its try (request 7) refused."""
    line = Line("c", asyncio.get_running_loop().time, lambda: False)
    counters = NameCounters()
    call = client_wait(services, counters, line, "c:h1")
    refused(line, call, 7)
    return line, counters, call


async def test_a_releasing_thread_claims_a_grant_for_a_parked_call_and_nothing_gives_it_back(
    services: Any,
) -> None:
    task = asyncio.current_task()  # the calls' own
    line, counters, waiter = refused_call(services)
    # Not parked yet (between its try and its park): its wait loop would try, not look.
    assert line.claim(b"=42 5000 7 c c:h1", task) is None
    parked = waiter.park(60)
    # Another client's grant, or one for an earlier request, is not this call's; nor is a
    # grant claimed for another task's call (a thread's earlier call, say).
    assert line.claim(b"=42 5000 7 other c:h1", task) is None
    assert line.claim(b"=42 5000 6 c c:h1", task) is None
    assert line.claim(b"=42 5000 7 c c:h1", object()) is None
    claimed = line.claim(b"=42 5000 7 c c:h1", task)
    assert claimed is not None
    call, grant = claimed
    assert call is waiter
    assert (grant.token, grant.lease_ms, grant.request, grant.claimed) == (42, 5000, 7, True)
    # Its place is gone, and so is the call from the line: the reply's and the message's
    # delivery hand nothing, no release of this client enters it again, and a call that leaves
    # without the lock withdraws nothing (the grant is the thread's).
    assert line.deliver_grant(b"=42 5000 7 c c:h1", from_reply=True)
    assert not parked.done()
    assert line.claim(b"=42 5000 7 c c:h1", task) is None
    assert line.next_entry("c:h0", "32000", 12, None, kept_ms=32000) == ""
    assert line.withdraw("c:h1") is None
    # A call that arrives now tries first: the claimed call still counts among the contenders
    # until its wait loop leaves, which may be after its thread released the lock, and nobody
    # would wake a newcomer parked behind it.  One that arrives behind a waiting call parks.
    assert counters.contenders == 1
    newcomer = client_wait(services, counters, line, "c:h2")
    assert newcomer.first_pause() is None
    behind = client_wait(services, counters, line, "c:h3")
    assert behind.first_pause() is not None
    for call in (newcomer, behind):
        call.leave(granted=False)
    # The call's wait loop, woken, takes the claimed grant (once).
    waiter.nudge()
    assert parked.result() is True
    assert waiter.woken() == grant
    assert waiter.woken() is None
    waiter.leave(granted=True)


async def test_a_grant_is_claimed_only_for_one_parked_call_with_a_lease_it_can_count_on(
    services: Any,
) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()  # the calls' own
    line, counters, first = refused_call(services)
    parked = first.park(60)
    # Woken before the claim (the message was read first): no longer parked.
    first.nudge()
    assert parked.done()
    assert line.claim(b"=42 5000 7 c c:h1", task) is None
    assert first.woken() is None
    # Two calls of one owner (an explicit owner's): the grant goes to the line, not a thread.
    second = client_wait(services, counters, line, "c:h1")
    parked, parked_second = first.park(60), second.park(60)
    assert line.claim(b"=43 5000 7 c c:h1", task) is None
    for call, waiter in ((first, parked), (second, parked_second)):
        call.unpark(waiter)
        call.leave(granted=False)
    # A lease other than the one asked (an explicit lease capped by the set): a try takes it.
    now = [loop.time()]
    timed = Line("c", lambda: now[0], lambda: False)

    def waiting_call(owner: str, asked_ms: int) -> ClientWait:
        return ClientWait(
            services,
            CHANNEL,
            counters,
            reentering=False,
            line=timed,
            owner=owner,
            asked_ms=asked_ms,
            watchdog=False,
        )

    capped = waiting_call("c:h2", 60_000)
    refused(timed, capped, 9)
    waiter = capped.park(60)
    assert timed.claim(b"=44 5000 9 c c:h2", task) is None
    capped.unpark(waiter)
    capped.leave(granted=False)
    # Too little of the lease left by the client's clock (a third of it): a try tells how much.
    fixed = waiting_call("c:h3", 3000)
    refused(timed, fixed, 11)
    waiter = fixed.park(60)
    now[0] += 2.1
    assert timed.claim(b"=45 3000 11 c c:h3", task) is None
    now[0] -= 0.2  # 1.1 s of 3 s left: enough
    assert timed.claim(b"=45 3000 11 c c:h3", task) is not None
    fixed.unpark(waiter)
    fixed.leave(granted=False)
