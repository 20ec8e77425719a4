"""A subscribed channel in one client: who waits on it, and the wake-ups handed to them.

:class:`Entry` wakes one waiter per message and per confirmation of its SUBSCRIBE;
:class:`BroadcastEntry` wakes them all.  A message is the entry's to read
(:meth:`Entry.deliver`): a kind whose messages carry more subclasses it in its own module (the
plain lock's :class:`~aiolock._core.line.LineEntry`, the fair lock's
:class:`~aiolock.fair.entry.NamedEntry`), so the transport knows no kind's message format.
:class:`~aiolock._redis.pubsub.PubSub` keeps the entries and their subscriptions.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections import deque
from typing import ClassVar, Protocol

from redis.exceptions import ResponseError

__all__ = ["BroadcastEntry", "Contention", "Entry"]


class Contention(Protocol):
    """What an entry needs to know of its lock's tasks (``NameCounters`` in practice)."""

    @property
    def contenders(self) -> int:
        """Tasks of this client after the lock: trying, or parked."""
        ...

    @property
    def first_tries(self) -> int:
        """Tasks after the lock that have not joined its channel: on their first try."""
        ...


class Entry:
    """A subscribed channel: who waits on it, and the wake-ups handed to them.

    Invariants: ``refs`` counts the tasks between :meth:`PubSub.join` and
    :meth:`PubSub.unreference`; ``_permits <= refs + contention.first_tries`` (restored by
    :meth:`trim` when a task leaves).  A wake-up is kept as a
    permit for the next task to park when nobody is parked, and also while a task of this client
    is on its first try: that task came before every parked one, and its try may have run
    before the release (or before the subscription existed).  More permits than tasks that may
    park would only cause empty retries.

    Thousands of tasks may wait on one client, so a parked waiter is only a future (``True``:
    woken, ``False``: its deadline passed) and its deadline in the queue; one timer per entry, at
    the earliest deadline, expires the waiters that are due.  Futures that ended by deadline or
    cancellation stay queued until skipped or compacted; ``parked`` counts the others.
    """

    __slots__ = (
        "_parked",
        "_permits",
        "_timer",
        "_timer_at",
        "_waiters",
        "channel",
        "confirmed",
        "contention",
        "refs",
        "refusal",
    )

    # A deadline is the end of the lease a task's try met: expiry publishes nothing.  Of this
    # client's tasks whose deadlines pass together, one tries: if the lock was free, it holds
    # it now (and its release wakes the next); if not, its try met a new lease, and it parks
    # with that; if it leaves, it wakes the next.  The others try only when woken.
    expires_one: ClassVar[bool] = True

    def __init__(self, channel: bytes, contention: Contention | None = None) -> None:
        self.channel = channel
        self.contention = contention  # of the lock this channel is for; None: no first tries
        self.refs = 0
        self.confirmed = False  # the server has confirmed its SUBSCRIBE
        self.refusal: ResponseError | None = None  # the server refused the SUBSCRIBE
        self._permits = 0
        self._parked = 0
        # (future, deadline, ticket), in ticket order: the order the tasks entered the contest.
        self._waiters: deque[tuple[asyncio.Future[bool], float, float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    @property
    def parked(self) -> int:
        return self._parked

    @property
    def permits(self) -> int:
        """Wake-ups kept for the next tasks to park (see the class docstring)."""
        return self._permits

    def wake_one(self) -> None:
        """Hand one wake-up to the first parked waiter, or keep it (see the class docstring).

        Kept while any task of this client is out trying (a first try, or a try after an
        earlier wake-up): that task is ahead of every parked one, and waking one more would
        put two tasks on the lock at once, where the later one may win.
        """
        first_tries = self._first_tries()
        while self._waiters and not self._trying():
            waiter, _, _ = self._waiters.popleft()
            if not waiter.done():
                self._parked -= 1
                waiter.set_result(True)
                return
        if self._permits < self.refs + first_tries:
            self._permits += 1

    def deliver(self, payload: bytes) -> None:
        """A message on the channel: a release, which wakes one waiter.

        The transport reads no message: a kind whose messages say more (the fair lock's name
        the waiter to wake) subclasses the entry and reads them in its override."""
        self.wake_one()

    def drop_wakeups(self) -> None:
        """A task of this client got the lock: drop the wake-ups kept meanwhile.

        Any try now would find the lock held; its next release wakes the head as usual.
        """
        self._permits = 0

    def trim(self) -> None:
        """Drop permits that no task can use any more (after one left)."""
        self._permits = min(self._permits, self.refs + self._first_tries())

    def _first_tries(self) -> int:
        return 0 if self.contention is None else self.contention.first_tries

    def _trying(self) -> int:
        """Tasks of this client after the lock and not parked: out on a try."""
        return 0 if self.contention is None else self.contention.contenders - self._parked

    def wake_all(self) -> None:
        """Wake every waiter: the server refused the channel, or the client closes.

        The tasks out trying meanwhile get a permit each: their try may have come too early.
        """
        out = self.refs - self._parked
        while self._waiters:
            waiter, _, _ = self._waiters.popleft()
            # A cancelled one is done already, and counted off by its own ``unpark``.
            if not waiter.done():
                self._parked -= 1
                waiter.set_result(True)
        self._permits = max(out, 0)

    def refuse(self, refusal: ResponseError) -> None:
        """The server refused the SUBSCRIBE (an ACL, say): wake every waiter to raise it."""
        if self.refusal is None:
            self.refusal = refusal
            self.wake_all()

    def raise_refusal(self) -> None:
        """Raise a copy of the server's refusal, if there was one.

        A copy per waiting task: tracebacks pile up on an exception object raised in several.
        """
        if self.refusal is not None:
            raise copy.copy(self.refusal)

    def confirm(self) -> None:
        """The server confirmed the SUBSCRIBE: one waiter tries, as after a release."""
        self.confirmed = True
        self.wake_one()

    def park(self, deadline: float, ticket: float = math.inf) -> asyncio.Future[bool]:
        """A future to await until a wake-up (``True``) or ``deadline`` (``False``; ``inf``: none).

        ``ticket``: the task's place in line (when it entered the contest); it is queued after
        every waiter with a lower or equal ticket, so that tasks woken together (their
        deadlines passed at once) re-park in their order, whatever order their tries came back in.

        A caller cancelled while awaiting it must call :meth:`unpark`; a caller that leaves the
        lock's wait loop without the lock wakes the next waiter (``PubSub.left``), which also
        hands on a wake-up it was given but will not use.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        if self._permits:
            self._permits -= 1
            waiter.set_result(True)
            return waiter
        waiters = self._waiters
        if len(waiters) > 2 * self._parked + 16:
            waiters = self._waiters = deque(item for item in waiters if not item[0].done())
        if not waiters or waiters[-1][2] <= ticket:
            waiters.append((waiter, deadline, ticket))  # a newcomer: the usual case
        else:
            place = next(i for i, item in enumerate(waiters) if item[2] > ticket)
            waiters.insert(place, (waiter, deadline, ticket))
        self._parked += 1
        if deadline < self._timer_at:
            self._arm(loop, deadline)
        return waiter

    def bound(self, until: float) -> None:
        """A task of this client got the lock, held until loop time ``until`` unless renewed
        or released: the parked ones try no later (see ``expires_one``; a hold that ends
        silently wakes one through its loss, but a release's message can be lost)."""
        if self.expires_one and self._parked and until < self._timer_at:
            self._arm(asyncio.get_running_loop(), until)

    def unbound(self) -> None:
        """A task of this client got the lock with the watchdog, which renews it: the parked
        ones try at its end, which the client hears of (:meth:`hold_ended`, or a loss that wakes
        one), and no deadline of theirs counts any more."""
        if self._timer is None:
            return  # no deadline armed: every parked one's is inf already (see park, bound)
        self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        self._waiters = deque((w, math.inf, t) for w, _, t in self._waiters if not w.done())

    def hold_ended(self) -> None:
        """A hold of this client on the lock is no longer tracked (released, lost, or given
        up to its lease).  Nothing to do here: a release publishes on this channel, and a loss
        wakes one; a kind whose release may tell another client only overrides it (the plain
        lock's :class:`~aiolock._core.line.LineEntry`)."""

    def wake(self, waiter: asyncio.Future[bool]) -> None:
        """Wake one parked waiter out of turn (another call of its owner got the lock)."""
        if not waiter.done():
            self._parked -= 1
            waiter.set_result(True)

    def expire(self, waiter: asyncio.Future[bool]) -> None:
        """End one parked waiter's park as if its deadline had passed (a subclass's own bound)."""
        if not waiter.done():  # else woken, cancelled or timed out already
            self._parked -= 1
            waiter.set_result(False)

    def unpark(self, waiter: asyncio.Future[bool]) -> None:
        """The caller of :meth:`park` was cancelled: stop counting it if it was still parked."""
        if waiter.cancelled():
            self._parked -= 1

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer, self._timer_at = None, math.inf
        if self.expires_one:
            self._expire_first()
            return
        # The loop may run a timer up to its clock resolution early.
        now = loop.time() + 0.001
        earliest = math.inf
        for waiter, deadline, _ in self._waiters:
            if waiter.done():
                continue
            if deadline <= now:
                self._parked -= 1
                waiter.set_result(False)
            else:
                earliest = min(earliest, deadline)
        if earliest < math.inf:
            self._arm(loop, earliest)

    def _expire_first(self) -> None:
        """A deadline passed: wake the first waiter in line, and drop every other deadline
        (see ``expires_one``)."""
        waiters = self._waiters
        first = next((waiter for waiter, _, _ in waiters if not waiter.done()), None)
        if first is not None:
            self._parked -= 1
            first.set_result(False)
        self._waiters = deque((w, math.inf, ticket) for w, _, ticket in waiters if not w.done())

    def __repr__(self) -> str:
        state = "refused" if self.refusal else "confirmed" if self.confirmed else "pending"
        return (
            f"<Entry {self.channel.decode(errors='replace')!r} [{state}, "
            f"refs:{self.refs}, parked:{self.parked}, permits:{self._permits}]>"
        )


class BroadcastEntry(Entry):
    """A channel whose every message wakes every waiter (a latch at zero, readers after a
    write): each of them looks at the state again, as each does when its deadline passes."""

    __slots__ = ()
    expires_one = False

    def deliver(self, payload: bytes) -> None:
        self.wake_all()

    def wake_one(self) -> None:
        self.wake_all()
