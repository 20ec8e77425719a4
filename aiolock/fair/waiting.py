"""How a fair waiter waits: parked on its client's channel of the lock until a message names it.

The wait loop's strategy for the fair lock (:class:`NamedWait`, a
:class:`~aiolock._core.waiting.WaitStrategy`), what keeps its place in the queue while it is parked
(:class:`Watch`, the lock's :class:`~aiolock.fair.watch.QueueWatch`), and the bound on
the tries a client's waiting calls have in flight (:class:`Turns`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from .._core.holds import NameCounters
from .._redis.entry import Entry
from .entry import Grant, NamedCall, NamedEntry

if TYPE_CHECKING:
    from .._core.services import Services

__all__ = ["Watch", "NamedWait", "Turns"]


class Watch(Protocol):
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
    its place is kept by ``watch``, which wakes it through the entry if it lost it.

    A release may grant the lock to the owner from the queue, and its message carries the
    grant (:class:`~aiolock.fair.entry.Grant`): :meth:`woken` hands it to the wait loop.  A
    grant naming a request of the owner made before this call began is from an earlier wait
    of it (given up, and taken back by its withdraw): it is dropped.
    """

    __slots__ = (
        "_channel",
        "_counters",
        "_entry",
        "_kept",
        "_services",
        "_since",
        "_watch",
    )

    def __init__(
        self,
        services: Services,
        channel: str,
        counters: NameCounters,
        owner: str,
        watch: Watch | None = None,
    ) -> None:
        super().__init__(owner)
        self._services = services
        self._channel = channel
        self._counters = counters
        self._watch = watch
        self._kept = False  # counted by the watch (since its first park)
        self._since = services.owners.last_request()  # this call's tries come after it
        counters.contenders += 1
        entry = services.pubsub.join_existing(channel)
        if entry is not None:
            self._enter(entry)
        self._entry = entry
        if watch is not None:
            watch.begin(owner)

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
        return None if self._watch is None else self._watch.turn()

    def tried(self) -> None:
        if self._watch is not None:
            self._watch.tried()

    def park(self, pause: float) -> asyncio.Future[Any]:
        entry = self._entry
        if entry is None:
            entry = self._entry = self._services.pubsub.join(
                self._channel, self._counters, NamedEntry
            )
            self._enter(entry)
        assert isinstance(entry, NamedEntry)
        if self._watch is not None and not self._kept:
            self._kept = True
            self._watch.add(entry)
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

    def granted(self, until: float) -> None:
        pass

    def nudge(self) -> None:
        entry = self._entry
        if entry is None:
            self.parked = True
        else:
            assert isinstance(entry, NamedEntry)
            entry.wake_call(self)

    def handed_over(self) -> bool:
        return False

    def leave(self, granted: bool) -> None:
        if self._watch is not None:
            self._watch.end(self.name)
            if self._kept:
                self._watch.discard()
        entry = self._entry
        if entry is not None:
            assert isinstance(entry, NamedEntry)
            entry.discard(self)
            self._services.pubsub.unreference(entry)
            self._counters.waiters -= 1
        self._counters.contenders -= 1


class Turns:
    """Bounds the tries a client's waiting calls have in flight on the fair locks of one slot.

    Thousands of waiters arrive at once, and each makes one try to take its place: beyond the
    bound, a call would wait for a connection with all its call frames; here it waits for its
    turn on a bare future, in order (see :meth:`NamedWait.turn`).
    """

    __slots__ = ("__weakref__", "_free", "_queued")

    def __init__(self, bound: int) -> None:
        self._free = bound
        self._queued: deque[asyncio.Future[None]] = deque()

    def take(self) -> asyncio.Future[None] | None:
        """``None`` if a try may start now (it took a turn), else a future done when it may."""
        if self._free:
            self._free -= 1
            return None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append(turn)
        return turn

    def give_back(self) -> None:
        """A try ended: hand its turn to the next one queued (a cancelled one has left)."""
        while self._queued:
            turn = self._queued.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1
