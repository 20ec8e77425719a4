"""``MultiLock``: several locks held as one, all or nothing.

The parts are taken one at a time in one global order (by key, then server), whatever order
they were given in, so two tasks that take (A, B) and (B, A) can never deadlock: both go for
the same one first.  The key comes first because every client names a lock by the same key,
while one server may be known by several addresses: two host names, or on a Cluster the node
each client's URL names.  Parts of the same key on two servers are ordered by the addresses
their clients were given, so those must be written alike everywhere.

The wait bounds the whole attempt; a failure, a timeout or a cancellation releases whatever
was taken before it propagates.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from typing import Any

from ._core.composite import (
    CompositeHold,
    CompositeStatistics,
    release_all,
    start_releases,
)
from ._core.guard import Guarded, Holding
from ._core.habits import held_by_another_task, teaching
from ._core.holds import Hold
from ._core.kind import LockKind
from ._core.metrics import traced
from ._core.validate import check_lease, check_wait
from .errors import LockNotOwnedError, LockTimeoutError

__all__ = ["MultiLock"]


class MultiLock(Guarded[tuple[int, ...]]):
    """Two or more locks, of any kinds and clients, held together or not at all.

    ::

        both = aiolock.MultiLock(client.lock("account:1"), client.lock("account:2"))
        async with both.acquire(wait=5) as guard:
            guard.fencing_token      # (token of account:1, token of account:2)

    It offers the calls of :class:`~aiolock.AsyncRLock`: ``try_lock`` holds every part or
    none, ``unlock`` releases every part, ``is_locked`` is true when all parts are locked and
    ``is_held`` when the caller holds all of them.  Its guard's ``fencing_token`` is the tuple
    of the parts' tokens in the order given, and ``lost`` turns true when any part is lost
    (leaving the block then releases the parts still held and raises ``LockLostError``).
    Each part keeps its own owner: the calling task, or the part's explicit owner.
    """

    __slots__ = ("_order", "locks", "name")

    @teaching
    def __init__(self, *locks: LockKind) -> None:
        for lock in locks:
            if not isinstance(lock, LockKind):
                raise TypeError(f"locks must be aiolock lock objects, not {type(lock).__name__}")
        if len(locks) < 2:
            raise ValueError(f"locks must name at least two locks, got {len(locks)}")
        self.locks = locks
        self.name = "+".join(lock.name for lock in locks)
        # One global order for every MultiLock of every process (see the module docstring).
        self._order = sorted(range(len(locks)), key=lambda i: locks[i].order)
        self._guards = None

    # -- acquiring ---------------------------------------------------------------------------

    @teaching
    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        """Hold every part, waiting at most ``wait`` seconds in all (``None``: forever).

        :returns: ``True`` once all are held, ``False`` (none held) if ``wait`` ran out.
        """
        return await self._traced_take(check_wait(wait), check_lease(lease))

    @teaching
    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Hold every part, waiting as long as it takes: ``await multi.lock()``.

        The arguments are checked at the call, as for the other kinds.
        """
        return self._hold_all(check_lease(lease))

    async def _hold_all(self, lease: float | None) -> None:
        await self._traced_take(None, lease)

    async def _enter(self, wait: float | None, lease: float | None) -> Holding[tuple[int, ...]]:
        if not await self._traced_take(wait, lease):
            raise LockTimeoutError(f"could not acquire {self.name!r} within {wait}s")
        parts = [part.caller_hold() for part in self.locks]
        token = tuple(part.token for part in parts)
        return CompositeHold(self.locks, parts, len(parts), token)

    async def _exit(self, holding: Holding[tuple[int, ...]]) -> None:
        assert isinstance(holding, CompositeHold)
        await holding.release()

    def _traced_take(self, wait: float | None, lease: float | None) -> Coroutine[Any, Any, bool]:
        tracing = self.locks[0].services.tracing  # the first part's client
        return traced(tracing, self._take(wait, lease), "multi", self.name, self._holds_of)

    def _holds_of(self, taken: bool) -> tuple[Hold, ...]:
        """The parts' holds, right after ``_take`` returned ``taken``."""
        return tuple(part.caller_hold() for part in self.locks) if taken else ()

    async def _take(self, wait: float | None, lease: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = math.inf if wait is None else loop.time() + wait
        while True:
            taken: list[LockKind] = []
            try:
                for index in self._order:
                    part = self.locks[index]
                    if wait is None:
                        await part.wait_for_grant(lease)
                    elif wait == 0:
                        if not await part.try_until(0, lease):  # one try
                            return False
                    elif (left := deadline - loop.time()) <= 0:
                        return False  # (``try_until(0)`` would be one try of any length)
                    elif not await part.try_until(left, lease):
                        return False
                    taken.append(part)
                if all(_still_held(part) for part in taken):
                    taken.clear()  # all held: nothing to give back
                    return True
                # A part taken first was lost while a later one was awaited (its lease ran
                # out, it was forced): give them all back, and take them again while the wait
                # lasts.
            finally:
                if taken:
                    # All at once, errors only gathered: one part's failed release must not
                    # keep the others held (a part's own settlement finishes a release that
                    # failed).  The wait bounds them too: past the deadline they finish in the
                    # background (a stalled server cannot hold the caller).
                    owners = [part.current_owner()[0] for part in taken]
                    releases = start_releases(
                        [part.release_one(owner) for part, owner in zip(taken, owners, strict=True)]
                    )
                    if wait:
                        await asyncio.wait([releases], timeout=max(deadline - loop.time(), 0))
                    else:
                        await asyncio.shield(releases)
            if wait == 0 or loop.time() >= deadline:
                return False

    # -- releasing ---------------------------------------------------------------------------

    @teaching
    async def unlock(self) -> None:
        """Release one hold of every part, all at once.

        :raises LockNotOwnedError: if the caller did not hold some part (the others are
            released all the same).  A connection error is raised after every part was tried;
            a part whose release failed is completed in the background.
        """
        owners = [part.current_owner()[0] for part in self.locks]
        outcomes = await release_all(
            [part.release_one(owner) for part, owner in zip(self.locks, owners, strict=True)]
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome  # every part was released or is settling; the first error shows
        missing = [index for index, left in enumerate(outcomes) if left is None]
        if not missing:
            return
        if any(self.locks[i].held_by_another_task(owners[i]) for i in missing):
            raise LockNotOwnedError(held_by_another_task(f"{self.name!r}"))
        names = [self.locks[i].name for i in missing]
        raise LockNotOwnedError(f"{self.name!r}: not held by this owner: {names}")

    async def force_unlock(self) -> bool:
        """Delete every part whoever holds it; ``True`` if any of them existed."""
        return any([await lock.force_unlock() for lock in self.locks])

    # -- inspecting --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """``True`` if every part is held by someone."""
        return all([await lock.is_locked() for lock in self.locks])

    async def is_held(self) -> bool:
        """``True`` if the caller holds every part."""
        return all([await lock.is_held() for lock in self.locks])

    async def hold_count(self) -> int:
        """How many times the caller holds every part (the fewest holds of any part)."""
        return min([await lock.hold_count() for lock in self.locks])

    async def remaining_lease(self) -> float | None:
        """Seconds until the first part expires; ``None`` if some part is not locked."""
        leases = [await lock.remaining_lease() for lock in self.locks]
        known = [lease for lease in leases if lease is not None]
        return min(known) if len(known) == len(leases) else None

    def statistics(self) -> CompositeStatistics:
        """Each part's statistics, and how many times this process holds them all (no I/O)."""
        parts = tuple(lock.statistics() for lock in self.locks)
        return CompositeStatistics(
            name=self.name,
            held=min(part.held for part in parts),
            lost=any(part.lost for part in parts),
            parts=parts,
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        state = f"held x{stats.held}" if stats.held else "lost" if stats.lost else "unlocked"
        return f"<MultiLock {self.name!r} [{state}, parts:{len(self.locks)}]>"


def _still_held(part: LockKind) -> bool:
    """The calling owner still holds the lock as far as its client knows (no I/O)."""
    hold = part.hold(part.current_owner()[0])
    return hold is not None and not hold.check_lost()
