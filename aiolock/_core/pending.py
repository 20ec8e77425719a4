"""The pending work of each (lock key, owner): :class:`PendingWork`, the part of
:class:`~aiolock._core.holds.Holds` keyed by the lock on the server.

A release that has to finish in the background (its caller was cancelled, or the reply never
came), the compensating release of a grant whose caller was cancelled, a waiter's withdraw: the
owner's next acquire or release of that lock waits for it first
(:meth:`PendingWork.wait_pending`), so hold counts stay exact.  After a fault, the releases
whose late copies the owner's next hold must refuse (:meth:`PendingWork.resent_release`) and
the id the owner goes by meanwhile (:meth:`PendingWork.alias`) are kept here too, and so is
what a background call that gave up may have left (:meth:`PendingWork.abandoned`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = ["ABANDONED_FOR", "Abandoned", "At", "PendingWork"]

logger = logging.getLogger("aiolock.lock")


class _Nothing:
    """An awaitable that is done at once (nothing to wait for)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends before its first step


_NOTHING: Final = _Nothing()

At = tuple[str, str]
"""A key (a registry key or a lock key, by the map) and an owner id."""

Abandoned = Literal["release", "withdraw"]
"""What the client gave up sending in the background: a release of a hold, or the withdraw of
a waiter's entry (a fair lock's place in its queue)."""

# How long after a background call gave up what it left may still be met: leases in use are
# seconds to minutes; past this, meeting a hold it left is a bug signal again.
ABANDONED_FOR = 600.0

# The (lock key, owner)s whose deferred work the running task is (or was started from): work
# deferred for a (lock key, owner) must never wait for itself.
_RUNNING_PENDING: contextvars.ContextVar[frozenset[At]] = contextvars.ContextVar(
    "aiolock_settling", default=frozenset()
)


@dataclass(eq=False, slots=True)
class LateReleases:
    """The releases of one (lock key, owner) resent lately, and the timer that forgets them at
    the end of the resend window (see :meth:`PendingWork.resent_release`)."""

    requests: list[int]
    timer: asyncio.TimerHandle


@dataclass(eq=False, slots=True)
class Alias:
    """The id an owner goes by on a lock for a while (see :meth:`PendingWork.alias`)."""

    id: str
    until: float  # loop time


class PendingWork:
    """The pending work, resent releases, aliases and abandoned calls of each (lock key,
    owner) (see the module docstring)."""

    def __init__(self, holds_as: Callable[[str, str], bool]) -> None:
        self._holds_as = holds_as  # whether an owner id has a hold on a lock (any mode)
        self._pending: dict[At, asyncio.Task[None]] = {}
        self._late: dict[At, LateReleases] = {}  # faults only
        # The id each owner goes by for a while (see alias), and whose alias each such id is.
        self._aliases: dict[At, Alias] = {}
        self._bases: dict[At, str] = {}
        # When a background call of each (lock key, owner) last gave up (loop time, oldest
        # first): what it left (a hold, a waiter's entry) may still be met for a while, and
        # that is no bug.
        self._abandoned: dict[tuple[str, str, Abandoned], float] = {}

    # -- pending background work ----------------------------------------------------------

    def defer(self, lock_key: str, owner: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background; the owner's next call on the lock waits for it.

        The rule that keeps this free of deadlock: ``work`` never waits for the pending work
        (:meth:`wait_pending`) of the same ``(lock_key, owner)``, directly or through an acquire
        or release of that owner on that lock, since it would wait for itself.  It may defer
        more work there (which runs after it).  The rule is checked: such a wait raises
        ``RuntimeError``.
        """
        at = (lock_key, owner)
        previous = self._pending.get(at)

        async def chained() -> None:
            # In this task's own context (and those of the tasks it starts): see wait_pending.
            _RUNNING_PENDING.set(_RUNNING_PENDING.get() | {at})
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            await work

        task = asyncio.get_running_loop().create_task(chained())
        self._pending[at] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._pending.get(at) is finished:
                del self._pending[at]
            if finished.cancelled():
                # Cancelled before it ran (its loop closed): work never started.
                work.close()
            elif finished.exception() is not None:
                logger.warning(
                    "background release of %s failed: %r", lock_key, finished.exception()
                )

        task.add_done_callback(done)

    def wait_pending(self, lock_key: str, owner: str) -> Awaitable[None]:
        """Wait for the owner's pending work on the lock (its failures never reach the
        caller); for an id :meth:`alias` gave, the work of the owner's earlier ids first.

        With none (every fault-free call), what it returns is done at once: no coroutine.

        :raises RuntimeError: called from that very work (see :meth:`defer`), which would
            wait for itself forever.
        """
        at = (lock_key, owner)
        if at not in self._pending and at not in self._bases:
            return _NOTHING
        return self._wait_pending(lock_key, owner)

    async def _wait_pending(self, lock_key: str, owner: str) -> None:
        ats = [(lock_key, owner)]
        base = self._bases.get((lock_key, owner))
        if base is not None:
            # An id :meth:`alias` gave waits for the owner's earlier ids too: the release that
            # made it is settled under the id it ended, which may hold the lock until then.
            earlier = [
                at
                for at in self._pending
                if at[0] == lock_key and base in (at[1], self._bases.get(at))
            ]
            ats = [at for at in earlier if at != (lock_key, owner)] + ats
        for at in ats:
            if at in _RUNNING_PENDING.get():
                raise RuntimeError(
                    f"deferred work of owner {at[1]!r} on {lock_key!r} waits for its own "
                    "settlement (it acquires or releases that lock as that owner): it would "
                    "never end"
                )
        for at in ats:
            while (task := self._pending.get(at)) is not None:
                await asyncio.wait([task])
                if self._pending.get(at) is task:
                    del self._pending[at]

    def abandoned(self, lock_key: str, owner: str, what: Abandoned = "release") -> None:
        """A background release of the owner's hold on the lock (or the withdraw of its
        waiter's entry) gave up: what it would have ended may linger."""
        now = asyncio.get_running_loop().time()
        abandoned = self._abandoned
        while abandoned:  # forget the old ones, so that owners that never return cost nothing
            first = next(iter(abandoned))
            if abandoned[first] > now - ABANDONED_FOR:
                break
            del abandoned[first]
        abandoned.pop((lock_key, owner, what), None)
        abandoned[(lock_key, owner, what)] = now

    def was_abandoned(self, lock_key: str, owner: str, what: Abandoned = "release") -> bool:
        """Whether such a background call of the owner on the lock gave up lately (the record
        is used up)."""
        when = self._abandoned.pop((lock_key, owner, what), None)
        return when is not None and when > asyncio.get_running_loop().time() - ABANDONED_FOR

    # -- resent releases and aliases (faults only) -------------------------------------------

    def resent_release(self, lock_key: str, owner: str, request: int, window: float) -> None:
        """The owner's release ``request`` on the lock was resent (a copy went out on a
        connection that failed) and is answered now (or given up on): that copy may still
        arrive, after the owner acquired again, and must not release the newer hold.

        Kept for ``window`` seconds (the client's resend window; from the last such release of
        the owner): meanwhile the owner's acquires of the lock carry it (:meth:`late_releases`),
        and the hold they make or re-enter refuses that copy (``release_one`` in
        ``scripts/common/_hold.lua``).  Nothing is kept without a fault.
        """
        at = (lock_key, owner)
        late = self._late.get(at)
        requests: list[int] = []
        if late is not None:
            requests = late.requests
            late.timer.cancel()
        if request not in requests:
            requests.append(request)
        timer = asyncio.get_running_loop().call_later(window, self._late.pop, at, None)
        self._late[at] = LateReleases(requests, timer)

    def late_releases(self, lock_key: str, owner: str) -> list[int]:
        """The owner's releases of the lock resent within the resend window (see
        :meth:`resent_release`); none, without a fault."""
        late = self._late.get((lock_key, owner))
        return [] if late is None else late.requests

    def alias(self, lock_key: str, owner: str) -> str:
        """The id ``owner`` goes by on the lock now: itself, but for the resend window after a
        release of it that was a command (an HDEL of its fields) and may still have a copy on
        its way (it was resent, or its outcome is unknown), and for as long as a hold made
        under that other id lasts.  A command cannot refuse its own late copy, which would end
        the owner's next hold: that hold goes by another id.  Faults only: without one this
        is a test of an empty dict."""
        if not self._aliases:
            return owner
        found = self._aliases.get((lock_key, owner))
        if found is None:
            return owner
        now = asyncio.get_running_loop().time()
        if (
            now < found.until
            or (lock_key, found.id) in self._pending
            or self._holds_as(lock_key, found.id)
        ):
            return found.id
        del self._aliases[(lock_key, owner)]
        self._bases.pop((lock_key, found.id), None)
        return owner

    def realias(self, lock_key: str, owner: str, request: int, window: float) -> None:
        """``owner`` (an id :meth:`alias` gave, or the owner's own) sent release ``request`` of
        the lock as a command that may still arrive late: the owner's holds of the lock go by
        a new id for ``window`` seconds (see :meth:`alias`)."""
        base = self._bases.get((lock_key, owner), owner)
        # After the client's id, where no owner's own id has ``a<n>:`` (they have ``x:``, ``t``,
        # ``h``, ``p``): no explicit owner's name makes another's alias, and the prefix that
        # the fair lock's scripts read as the client stays.
        client, _, rest = base.partition(":")
        new = f"{client}:a{request}:{rest}"
        now = asyncio.get_running_loop().time()
        for at, old in list(self._aliases.items()):  # few: one per recent fault
            if old.until <= now and not self._holds_as(at[0], old.id):
                del self._aliases[at]
                self._bases.pop((at[0], old.id), None)
        self._aliases[(lock_key, base)] = Alias(new, now + window)
        self._bases[(lock_key, new)] = base

    def clear_pending(self) -> None:
        """Forget every record (the client closed); the pending tasks are the caller's."""
        self._abandoned.clear()
        for late in self._late.values():
            late.timer.cancel()
        self._late.clear()
        self._aliases.clear()
        self._bases.clear()
