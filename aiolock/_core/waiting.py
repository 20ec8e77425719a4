"""How a task waits between two tries of a lock: one strategy object per waiting call.

The wait loop (:mod:`aiolock._core.acquire`) asks its strategy when to try first, parks
on the future it gets for a pause, and tells it when it leaves.  Every method is synchronous, so a
parked task carries no extra coroutine frame.

- :class:`ChannelWait`: park on the lock's pub/sub channel, one wake-up per release, FIFO among
  the tasks of this client (the plain lock).
- :class:`NamedWait`: park on the lock's channel for this client; a hand-off message names
  the one waiter it wakes, or grants it the lock (the fair lock, whose queue is in Redis).
- :class:`Backoff`: never subscribe; sleep a full-jitter exponential backoff (the spin lock).
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any, Protocol

from .._redis.pubsub import Entry, Grant, NamedCall, NamedEntry
from .holds import NameCounters

if TYPE_CHECKING:
    from .services import Services

__all__ = ["Backoff", "ChannelWait", "Keeper", "NamedWait", "Waiting"]


class Waiting(Protocol):
    """One waiting call's strategy (see the module docstring)."""

    def first_pause(self) -> float | None:
        """Seconds to park before the first try, or ``None`` to try at once."""
        ...

    def turn(self) -> asyncio.Future[None] | None:
        """Before each try: ``None`` to start it now, or a future done when it may start."""
        ...

    def tried(self) -> None:
        """After each try that was let start (:meth:`turn`)."""
        ...

    def park(self, pause: float) -> asyncio.Future[Any]:
        """A future that is done at a wake-up or after ``pause`` seconds (``inf``: none)."""
        ...

    def unpark(self, waiter: asyncio.Future[Any]) -> None:
        """The caller was cancelled while awaiting ``waiter``."""
        ...

    def woken(self) -> Grant | None:
        """Called after each wake-up, before the next try; raises if trying again is futile.

        Returns the grant a message brought this call, if any (the fair lock's hand-off): the
        wait loop records it instead of trying, if it can.
        """
        ...

    def held(self, until: float) -> None:
        """The call got the lock by a try, held until loop time ``until`` unless renewed."""
        ...

    def leave(self, granted: bool) -> None:
        """The call leaves the wait loop, with the lock or without it."""
        ...

    def nudge(self) -> None:
        """Another call of this call's owner got the lock: try again at once (a reentrant
        grant), now if parked, else at the next park."""
        ...


class ChannelWait:
    """Park on the lock's channel; a release wakes one of this client's waiters.

    FIFO within this client: while some of its tasks are already after the lock (trying or
    parked), a newcomer (a task that has just released it, say) queues behind them instead of
    barging in, and those that leave without the lock wake the next in line.  An owner that
    already holds the lock re-enters at once: it must not queue behind its own waiters.  A
    queued task parks until the tasks ahead hand on (with no TTL to go by, at most one watchdog
    lease).  Parked tasks are in the order they entered (a ticket each), whatever order tries
    that were woken together (their deadlines passed at once, say) come back in.
    """

    __slots__ = (
        "_channel",
        "_counters",
        "_entry",
        "_entry_type",
        "_parked",
        "_services",
        "_shared",
        "_ticket",
        "_try_first",
    )

    def __init__(
        self,
        services: Services,
        channel: str,
        counters: NameCounters,
        *,
        reentering: bool,
        shared: bool = False,
        entry_type: type[Entry] = Entry,
    ) -> None:
        self._services = services
        self._entry_type = entry_type  # a BroadcastEntry for readers: a message wakes them all
        # Shared (a semaphore's permits): a grant does not mean the next task would fail, so
        # it passes the turn on, as a task that leaves without the lock does.
        self._shared = shared
        self._channel = channel
        self._counters = counters
        self._entry: Entry | None = None
        # Its parked future; ``True``: nudged between two parks (see nudge).
        self._parked: asyncio.Future[Any] | bool | None = None
        self._try_first = reentering or counters.contenders == 0
        # The task's place in line among this client's waiters; an owner re-entering a lock
        # it holds goes before all of them.
        counters.tickets += 1
        self._ticket = 0 if reentering else counters.tickets
        counters.contenders += 1

    def first_pause(self) -> float | None:
        return None if self._try_first else self._services.watchdog_timeout

    def turn(self) -> asyncio.Future[None] | None:
        return None

    def tried(self) -> None:
        pass

    def park(self, pause: float) -> asyncio.Future[Any]:
        entry = self._entry
        if entry is None:
            # A release published during the first try, or the confirmation of a subscription
            # made meanwhile, left a permit for this task (see Entry): no try needed before.
            entry = self._entry = self._services.pubsub.join(
                self._channel, self._counters, self._entry_type
            )
            self._counters.waiters += 1
        if self._parked is True:  # nudged between two parks: one try at once, then park
            self._parked = None
            return _woken()
        # A bare future in the entry's queue: no coroutine frame or timeout context per task.
        waiter = self._parked = entry.park(asyncio.get_running_loop().time() + pause, self._ticket)
        return waiter

    def unpark(self, waiter: asyncio.Future[Any]) -> None:
        if self._entry is not None:
            self._entry.unpark(waiter)

    def woken(self) -> Grant | None:
        if self._entry is not None:
            self._entry.raise_refusal()  # the server refused the channel: waiting is futile
        self._services.check_open()  # woken because the client closes: no more tries
        return None

    def held(self, until: float) -> None:
        # The others of this client wait behind this hold: no longer than its lease.
        if self._entry is not None:
            self._entry.bound(until)

    def nudge(self) -> None:
        waiter = self._parked
        if isinstance(waiter, asyncio.Future) and not waiter.done() and self._entry is not None:
            self._entry.wake(waiter)
        else:
            self._parked = True

    def leave(self, granted: bool) -> None:
        self._parked = None
        pubsub = self._services.pubsub
        if self._entry is not None:
            pubsub.unreference(self._entry)
            self._counters.waiters -= 1
        self._counters.contenders -= 1
        pubsub.left(self._channel, granted=granted and not self._shared)


class Keeper(Protocol):
    """What keeps the server-side places of a client's parked waiters on one lock (the fair
    lock's keep-alive): one call for all of them, instead of a try per waiter; it also bounds
    the tries in flight from the client."""

    def add(self, entry: NamedEntry) -> None:
        """A waiter parked for the first time, on ``entry`` (whose names it may wake)."""
        ...

    def discard(self) -> None:
        """A waiter that had parked stopped waiting."""
        ...

    def turn(self) -> asyncio.Future[None] | None:
        """``None`` if a try may start now (it took a turn), else a future done when it may."""
        ...

    def tried(self) -> None:
        """A try that took a turn ended."""
        ...

    def begin(self, owner: str) -> None:
        """A waiting call of ``owner`` begins (its tries tell the server whether the owner may
        have a place already)."""
        ...

    def end(self, owner: str) -> None:
        """That call ended."""
        ...


class NamedWait(NamedCall):
    """Park on this client's channel of the lock until a hand-off names this owner.

    The queue lives in Redis, so every call tries at once (its try takes its place in line).
    If this client already has waiters on the lock, the owner registers on their entry before
    its first try, so that a hand-off naming it while the try is in flight is not lost; the
    first waiter of a client subscribes after its try, and the subscription's confirmation
    wakes every waiter to try (a hand-off may have been published before it).  While parked,
    its place is kept by ``keeper``, which wakes it through the entry if it lost it.

    A release may grant the lock to the owner from the queue, and its message carries the
    grant (:class:`~aiolock._redis.pubsub.Grant`): :meth:`woken` hands it to the wait loop.  A
    grant naming a request of the owner made before this call began is from an earlier wait
    of it (given up, and taken back by its withdraw): it is dropped.
    """

    __slots__ = (
        "_channel",
        "_counters",
        "_entry",
        "_keeper",
        "_kept",
        "_services",
        "_since",
    )

    def __init__(
        self,
        services: Services,
        channel: str,
        counters: NameCounters,
        owner: str,
        keeper: Keeper | None = None,
    ) -> None:
        super().__init__(owner)
        self._services = services
        self._channel = channel
        self._counters = counters
        self._keeper = keeper
        self._kept = False  # counted by the keeper (since its first park)
        self._since = services.owners.last_request()  # this call's tries come after it
        counters.contenders += 1
        entry = services.pubsub.join_existing(channel)
        if entry is not None:
            self._enter(entry)
        self._entry = entry
        if keeper is not None:
            keeper.begin(owner)

    def _enter(self, entry: Entry) -> None:
        assert isinstance(entry, NamedEntry)
        entry.add(self)
        self._counters.waiters += 1

    def first_pause(self) -> float | None:
        return None

    def turn(self) -> asyncio.Future[None] | None:
        # Thousands of waiters arriving at once each queue with a try: one waiting for its
        # turn here costs a future, one waiting for a connection inside the call costs its
        # whole chain of call frames.
        return None if self._keeper is None else self._keeper.turn()

    def tried(self) -> None:
        if self._keeper is not None:
            self._keeper.tried()

    def park(self, pause: float) -> asyncio.Future[Any]:
        entry = self._entry
        if entry is None:
            entry = self._entry = self._services.pubsub.join(
                self._channel, self._counters, NamedEntry
            )
            self._enter(entry)
        assert isinstance(entry, NamedEntry)
        if self._keeper is not None and not self._kept:
            self._kept = True
            self._keeper.add(entry)
        return entry.park_named(self, asyncio.get_running_loop().time() + pause)

    def unpark(self, waiter: asyncio.Future[Any]) -> None:
        if self._entry is not None:
            self._entry.unpark(waiter)

    def woken(self) -> Grant | None:
        entry = self._entry
        if entry is not None:
            entry.raise_refusal()
        self._services.check_open()
        if entry is None:
            return None
        assert isinstance(entry, NamedEntry)
        grant = entry.take_grant(self.name)
        return grant if grant is not None and grant.request > self._since else None

    def held(self, until: float) -> None:
        pass

    def nudge(self) -> None:
        entry = self._entry
        if entry is None:
            self.parked = True
        else:
            assert isinstance(entry, NamedEntry)
            entry.wake_call(self)

    def leave(self, granted: bool) -> None:
        if self._keeper is not None:
            self._keeper.end(self.name)
            if self._kept:
                self._keeper.discard()
        entry = self._entry
        if entry is not None:
            assert isinstance(entry, NamedEntry)
            entry.discard(self)
            self._services.pubsub.unreference(entry)
            self._counters.waiters -= 1
        self._counters.contenders -= 1


class Backoff:
    """Sleep between tries: full jitter over a delay doubling from ``initial`` to ``maximum``.

    Each pause is drawn from ``[0, delay]`` and never exceeds what the try allowed (the lock's
    remaining lease); the caller's deadline bounds it from outside.  A task counts as a waiter
    from its first pause until it leaves.
    """

    __slots__ = (
        "_counters",
        "_delay",
        "_handle",
        "_maximum",
        "_nudged",
        "_services",
        "_waiter",
        "_waiting",
    )

    def __init__(
        self, services: Services, counters: NameCounters, *, initial: float, maximum: float
    ) -> None:
        self._services = services
        self._counters = counters
        self._delay = initial
        self._maximum = maximum
        self._handle: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[Any] | None = None
        self._nudged = False
        self._waiting = False
        counters.contenders += 1

    def first_pause(self) -> float | None:
        return None

    def turn(self) -> asyncio.Future[None] | None:
        return None

    def tried(self) -> None:
        pass

    def park(self, pause: float) -> asyncio.Future[Any]:
        if not self._waiting:
            self._waiting = True
            self._counters.waiters += 1
        if self._nudged:
            self._nudged = False
            return _woken()
        loop = asyncio.get_running_loop()
        sleep = min(random.uniform(0, self._delay), pause)
        self._delay = min(self._delay * 2, self._maximum)
        waiter: asyncio.Future[Any] = loop.create_future()
        self._handle = loop.call_later(sleep, _wake, waiter)
        self._waiter = waiter
        return waiter

    def unpark(self, waiter: asyncio.Future[Any]) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def woken(self) -> Grant | None:
        self._services.check_open()
        return None

    def held(self, until: float) -> None:
        pass

    def nudge(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._handle is not None:
                self._handle.cancel()
            waiter.set_result(True)
        else:
            self._nudged = True

    def leave(self, granted: bool) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._waiting:
            self._counters.waiters -= 1
        self._counters.contenders -= 1


def _wake(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_result(True)


def _woken() -> asyncio.Future[Any]:
    """A future already done: a wake-up that came before the park."""
    woken: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    woken.set_result(True)
    return woken
