"""What ``MultiLock`` and ``RedLock`` share: a hold made of parts, and its statistics.

A composite hold is held while at least ``needed`` of its parts are (all of them for a
``MultiLock``, a majority for a ``RedLock``); it is lost, once, the moment that stops being
true, and then tells its own listeners (a guard's ``cancel_on_loss``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .holds import Hold
from .kind import LockKind
from .state import LockStatistics

__all__ = ["CompositeHold", "CompositeStatistics", "release_all", "start_releases"]

TokenT = TypeVar("TokenT")

# Releases whose caller was cancelled, finishing in the background (a reference keeps them).
_finishing: set[asyncio.Future[list[Any]]] = set()


def start_releases(releases: Sequence[Awaitable[Any]]) -> asyncio.Future[list[Any]]:
    """Start the parts' releases at once; the future of each one's outcome or exception.

    Nothing cancels them: a release task cancelled before its first step would never send
    its release (a part's release settles a cancellation only once it runs), and the part
    would stay held until its lease ran out.  Not waited for, they finish in the background.
    """
    gathered = asyncio.gather(*releases, return_exceptions=True)
    _finishing.add(gathered)
    gathered.add_done_callback(_finishing.discard)
    return gathered


async def release_all(releases: Sequence[Awaitable[Any]]) -> list[Any]:
    """Run the parts' releases at once (see :func:`start_releases`) and wait for them; each
    one's outcome or exception, in order.  A cancelled caller leaves them running."""
    return await asyncio.shield(start_releases(releases))


class CompositeHold(Generic[TokenT]):
    """Parts held together; lost once fewer than ``needed`` of them are still held."""

    __slots__ = ("_notified", "listeners", "locks", "needed", "parts", "token")

    def __init__(
        self, locks: Sequence[LockKind], parts: Sequence[Hold], needed: int, token: TokenT
    ) -> None:
        self.locks = tuple(locks)  # the lock of each part
        self.parts = tuple(parts)
        self.needed = needed
        self.token = token
        self.listeners: list[Callable[[], object]] = []
        self._notified = False
        for part in self.parts:
            part.listeners.append(self._part_lost)

    def check_lost(self) -> bool:
        return sum(not part.check_lost() for part in self.parts) < self.needed

    @property
    def lost(self) -> bool:
        return sum(not part.lost for part in self.parts) < self.needed

    @property
    def lost_reason(self) -> str | None:
        reasons = [f"{part.name!r}: {part.lost_reason}" for part in self.parts if part.check_lost()]
        return "; ".join(reasons) if self.check_lost() else None

    def valid_for(self) -> float:
        """Seconds for which at least ``needed`` parts surely stay held (no I/O)."""
        left = sorted((part.valid_for() for part in self.parts), reverse=True)
        return left[self.needed - 1] if not self.check_lost() else 0.0

    def _part_lost(self) -> None:
        if self.check_lost() and not self._notified:
            self._notified = True
            for listener in list(self.listeners):
                listener()

    async def release(self) -> None:
        """Release every part still held, all at once; the first error is raised after.

        A lost part is never touched: it may be somebody else's now.
        """
        for part in self.parts:
            if self._part_lost in part.listeners:
                part.listeners.remove(self._part_lost)
        outcomes = await release_all(
            [
                lock.release_one(part.owner)
                for lock, part in zip(self.locks, self.parts, strict=True)
                if not part.check_lost()
            ]
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


@dataclass(frozen=True, slots=True)
class CompositeStatistics:
    """A snapshot of a ``MultiLock`` or ``RedLock`` from this process' view (no I/O).

    :ivar name: the composite's name.
    :ivar held: how many times the calling process' owners hold it (the fewest holds among
        the parts it needs).
    :ivar lost: ``True`` if its last hold was lost.
    :ivar parts: each part's own statistics, in the order given.
    """

    name: str
    held: int
    lost: bool
    parts: tuple[LockStatistics, ...]
