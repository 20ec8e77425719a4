"""This client's part in one fair lock's queue: its parked waiters there, and when to look.

A parked waiter does not try again, neither to keep its place nor when the lease it met runs
out: its client's :class:`~aiolock.fair.alive.AliveKey` keeps its place, and looks at the lock
when a lease this client knows of runs out (expiry publishes nothing) and at least once a
``fair_wait_timeout``, handing a free lock over to its queue's first live waiter.  What it needs
to know of each lock is here (:class:`QueueWatch`, one per lock name), with the record of the
calls of each owner that the lock's tries read.
"""

from __future__ import annotations

import asyncio
import math

from .._core.clock import ServerClock
from .alive import AliveKey
from .entry import NamedEntry
from .queue import FairKeys
from .waiting import Turns

__all__ = ["QueueWatch"]

_RESAMPLE = 10.0
"""How old (s) the sample of the server's clock may be for a try to send its lower bound of
the server's time instead of having the script read the clock (and so sample it again)."""


class QueueWatch:
    """This client's part in one fair lock's queue: its parked waiters, and when to look.

    The waiters' places are kept by the client's :class:`~aiolock.fair.alive.AliveKey` of the
    lock's slot, which also looks at the lock, for all the client's fair locks of the slot in
    one call: when a lease this client knows of runs out (expiry publishes nothing; ``due``),
    and at least once a wait timeout (a grant to a waiter that vanished, a head only woken).
    A look hands the lock over if it is free; an owner the server no longer has in the queue
    is woken to try again.  Shared by the waiting calls of the name (through the client's name
    cache).
    """

    __slots__ = (
        "__weakref__",
        "_alive",
        "_calls",
        "_entry",
        "_parked",
        "_turns",
        "clock",
        "count_at",
        "due",
        "keys",
        "look_at",
        "single_tries",
    )

    def __init__(self, keys: FairKeys, alive: AliveKey, turns: Turns) -> None:
        self.keys = (keys.lock, keys.queue, keys.wake_prefix)
        self._alive = alive
        self._turns = turns
        # The server's clock against the loop's, from the name's queued tries: per name, so
        # that on a Cluster it is the clock of the node the name lives on.
        self.clock = ServerClock()
        # Owners making one attempt that will not wait (try_lock(wait=0), a composite's part),
        # with how many such calls each has in flight: their tries ask for no grant from the
        # queue (the withdraw that follows a refusal would have to take it back).
        self.single_tries: dict[str, int] = {}
        # The acquire calls of each owner in progress: -1 for one that has not tried yet (its
        # first try tells the server the owner has nothing there: no place to look for), its
        # member of the queue for one that took a place (its retries and its withdraw name
        # it: no search), else how many there are.
        self._calls: dict[str, int | str] = {}
        self._parked = 0  # waiting calls that parked, on _entry (whose names they are)
        self._entry: NamedEntry | None = None
        self.due = math.inf  # (loop time) the lock may be free then with nobody told
        self.look_at = 0.0  # the next look at the lock, at the latest
        self.count_at = 0.0  # the next look that also checks the queue has our owners

    def begin(self, owner: str) -> None:
        calls = self._calls.get(owner)
        self._calls[owner] = -1 if calls is None else _count(calls) + 1

    def end(self, owner: str) -> None:
        calls = _count(self._calls.pop(owner, 1)) - 1
        if calls:
            self._calls[owner] = calls

    def first_try(self, owner: str) -> bool:
        """Whether this try of ``owner`` is the first of its only waiting call, so that the
        owner has nothing on the server (its earlier calls' withdraws were settled first; one
        that gave up is remembered: see ``AsyncFairLock._left_behind``).
        Not for a call that will not wait (``single_tries``): it reads the lock hash, and so
        adopts a grant from the queue its owner may have had since a withdraw that never landed."""
        if self._calls.get(owner) != -1:
            return False
        self._calls[owner] = 1
        return owner not in self.single_tries

    def server_ms(self) -> int | None:
        """This client's lower bound of the server's time now (ms), from a sample of its clock
        younger than ``_RESAMPLE`` (ageing covers the clocks' rates, not a server changed
        since), or ``None``: the script then reads the clock."""
        now = asyncio.get_running_loop().time()
        if self.clock.age(now) >= _RESAMPLE:
            return None
        return self.clock.server_ms_at_least(now)

    def placed(self, owner: str, member: str) -> None:
        """A try of ``owner``'s only call took (or kept) this place in the queue (``""``:
        it took none)."""
        if _count(self._calls.get(owner, 2)) == 1:
            self._calls[owner] = member

    def member(self, owner: str) -> str | None:
        """The place of ``owner``'s only call in the queue, as its last try left it (``""``:
        none), or ``None`` when the client does not know it."""
        calls = self._calls.get(owner)
        return calls if isinstance(calls, str) else None

    def add(self, entry: NamedEntry) -> None:
        self._parked += 1
        if self._parked == 1:
            self._entry = entry
            self._alive.join(self)

    def discard(self) -> None:
        self._parked -= 1
        if not self._parked:
            self._entry = None
            self._alive.leave(self)

    def turn(self) -> asyncio.Future[None] | None:
        """``None`` if a try may start now (it took a turn), else a future done when it may
        (see :meth:`Turns.take`)."""
        return self._turns.take()

    def tried(self) -> None:
        self._turns.give_back()

    def expect(self, at: float) -> None:
        """The lock may be free at loop time ``at`` with nobody told (a lease that runs out)."""
        if at < self.due:
            self.due = at
            if self._parked:
                self._alive.schedule()

    def owners(self) -> list[str]:
        return [] if self._entry is None else self._entry.names()

    def wake(self, owners: list[bytes | str] | None = None) -> None:
        """Wake ``owners`` (all waiting, for ``None``) to try again: they lost their places."""
        entry = self._entry
        if entry is None:
            return
        for name in entry.names() if owners is None else owners:
            entry.wake_named(name.decode() if isinstance(name, bytes) else name)


def _count(calls: int | str) -> int:
    """How many calls a :attr:`QueueWatch._calls` value stands for."""
    return 1 if isinstance(calls, str) or calls == -1 else calls
