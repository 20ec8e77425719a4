"""How a task waits between two tries of a lock: one strategy object per waiting call.

The wait loop (:mod:`aiolock._core.acquire`) asks its strategy when to try first, parks
on the future it gets for a pause, and tells it when it leaves.  Every method is synchronous, so a
parked task carries no extra coroutine frame.

- :class:`ChannelWait`: park on the lock's pub/sub channel, one wake-up per release, FIFO among
  the tasks of this client (the read-write lock, the semaphore); the plain lock's
  :class:`~aiolock._core.line.ClientWait` is one, in its client's line, woken by a grant.
- :class:`~aiolock.fair.waiting.NamedWait` (in the fair lock's package): park on the lock's
  channel for this client; a hand-off message names the one waiter it wakes, or grants it the
  lock (:class:`MessageGrant`).
- :class:`Backoff`: never subscribe; sleep a full-jitter exponential backoff (the spin lock).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._redis.entry import Contention, Entry
from .holds import NameCounters

if TYPE_CHECKING:
    from .services import Services

__all__ = ["Backoff", "ChannelWait", "MessageGrant", "WaitStrategy"]


class MessageGrant(Protocol):
    """A grant of the lock a message brought a waiting call (the hand-off of the plain and
    fair locks): the wait loop passes it from :meth:`WaitStrategy.woken` to the kind, which
    records it if it can count on it.  The lock was granted for ``lease_ms``, with fencing
    token ``token``, on behalf of the acquire request ``request``; each kind's grant says
    when, in its own terms."""

    @property
    def token(self) -> int: ...

    @property
    def lease_ms(self) -> int: ...

    @property
    def request(self) -> int: ...


class WaitStrategy(Protocol):
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

    def woken(self) -> MessageGrant | None:
        """Called after each wake-up, before the next try; raises if trying again is futile.

        Returns the grant a message brought this call, if any (the fair lock's hand-off): the
        wait loop records it instead of trying, if it can.
        """
        ...

    def granted(self, until: float) -> None:
        """The call got the lock by a try, held until loop time ``until`` unless renewed."""
        ...

    def handed_over(self) -> bool:
        """Whether the lock was handed to the call's caller past the wait loop (a grant a
        releasing thread claimed for a waiting thread): the call leaves as granted, whatever
        ended its wait."""
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
        entry_type: Callable[[bytes, Contention | None], Entry] = Entry,
        others: bool | None = None,
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
        # Others of this client after the lock (``others``: as a caller that knows better than
        # the count of contenders says, which includes calls that hold it already).
        self._try_first = reentering or not (counters.contenders if others is None else others)
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

    def parked(self) -> bool:
        """Whether the call awaits its park's future, not woken yet: its wait loop asks
        :meth:`woken` before it tries again.  Any thread may ask (the loop may wake it the
        next moment)."""
        waiter = self._parked
        return isinstance(waiter, asyncio.Future) and not waiter.done()

    def woken(self) -> MessageGrant | None:
        if self._entry is not None:
            self._entry.raise_refusal()  # the server refused the channel: waiting is futile
        self._services.check_open()  # woken because the client closes: no more tries
        return None

    def granted(self, until: float) -> None:
        # The others of this client wait behind this hold: no longer than its lease (``inf``:
        # until its end, which the client hears of).
        if self._entry is not None:
            if until == math.inf:
                self._entry.unbound()
            else:
                self._entry.bound(until)

    def nudge(self) -> None:
        waiter = self._parked
        if isinstance(waiter, asyncio.Future) and not waiter.done() and self._entry is not None:
            self._entry.wake(waiter)
        else:
            self._parked = True

    def handed_over(self) -> bool:
        return False

    def leave(self, granted: bool) -> None:
        self._parked = None
        pubsub = self._services.pubsub
        if self._entry is not None:
            pubsub.unreference(self._entry)
            self._counters.waiters -= 1
        self._counters.contenders -= 1
        pubsub.left(self._channel, granted=granted and not self._shared)


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

    def woken(self) -> MessageGrant | None:
        self._services.check_open()
        return None

    def granted(self, until: float) -> None:
        pass

    def nudge(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._handle is not None:
                self._handle.cancel()
            waiter.set_result(True)
        else:
            self._nudged = True

    def handed_over(self) -> bool:
        return False

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
