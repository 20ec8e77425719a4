"""What a client keeps per lock name, shared by every lock object of that kind and name
(:class:`NameState`), and the snapshot of it that ``statistics()`` returns."""

from __future__ import annotations

from dataclasses import dataclass

from .holds import NameCounters
from .keys import LockKeys
from .waiting import WaitStrategy

__all__ = ["LockStatistics", "NameState"]


@dataclass(frozen=True, slots=True)
class LockStatistics:
    """A snapshot of one lock name, as seen by this client (no I/O).

    :ivar name: the lock's name.
    :ivar held: holds this client's owners have on it now (the reentrant count).
    :ivar lost: ``True`` if this client's last hold on it was lost.
    :ivar waiters: this client's tasks waiting for it now.
    :ivar acquisitions: fresh grants to this client.
    :ivar renewals: successful watchdog renewals.
    :ivar losses: holds lost (expired, forced, taken over).
    """

    name: str
    held: int
    lost: bool
    waiters: int
    acquisitions: int
    renewals: int
    losses: int


@dataclass(eq=False, slots=True, weakref_slot=True)
class NameState:
    """What every lock object of one kind and name shares in a client: keys, counters, and
    the waiting calls of explicit owners."""

    keys: LockKeys
    counters: NameCounters
    # owner -> its calls in the wait loop, for the explicit owners that have some: two tasks
    # may share an owner, and a grant to one of its calls is a reentrant grant for the others.
    waiting: dict[str, list[WaitStrategy]] | None = None
    # The plain lock's line of waiting calls (``_core/line.py``), made by the name's first call
    # of the wait loop and kept with the name, not made again for every acquire.
    line: object | None = None

    def join(self, owner: str, waiting: WaitStrategy) -> None:
        calls = self.waiting
        if calls is None:
            calls = self.waiting = {}
        calls.setdefault(owner, []).append(waiting)

    def others_wait(self, owner: str) -> bool:
        """Whether ``owner`` has more than one call in the wait loop."""
        return self.waiting is not None and len(self.waiting.get(owner, ())) > 1

    def leave(self, owner: str, waiting: WaitStrategy, *, granted: bool) -> None:
        """``waiting`` left the wait loop; if it got the lock, the owner's other calls try
        again at once (they would otherwise wait for a release that this grant put off)."""
        calls = self.waiting
        assert calls is not None
        mine = calls[owner]
        mine.remove(waiting)
        if not mine:
            del calls[owner]
        elif granted:
            for other in mine:
                other.nudge()
