"""The kinds' public calls and statistics: :class:`HoldKind` and :class:`LockKind`.

:class:`HoldKind` owns the public calls (``try_lock``, ``lock``, ``unlock``, the reads),
guards and ``async with``, statistics and the repr; :class:`LockKind` adds ``force_unlock``,
which every lock kind has and the semaphore's permits have not.  They are built on the engine:
:mod:`aiolock._core.acquire` (the wait loop and one attempt) over :mod:`aiolock._core.release`
(one release and its wake-ups) over :class:`~aiolock._core.hooks.KindHooks` (what a kind
supplies: its keys, its scripts, how its waiters wait).

Names without an underscore that SPEC does not list (``keys``, ``try_until``, ``release_one``...)
are internal: the composites, the settlement, the command line and the tests call them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .. import _scripts
from .._scripts import Call
from ..errors import LockNotOwnedError, LockTimeoutError
from .acquire import Acquiring
from .guard import Guarded, Holding
from .guarding import Guarding
from .habits import held_by_another_task, teaching
from .holds import Hold, NameCounters
from .keys import hash_tag
from .metrics import traced
from .services import Services
from .state import LockStatistics, NameState
from .validate import check_lease, check_wait

__all__ = ["HoldKind", "LockKind"]

_T = TypeVar("_T")


def _held(result: bool) -> bool:
    """Whether a ``try_lock`` call holds the lock: its result (for the span)."""
    return result


def _always(_: object) -> bool:
    """An acquire call that returns holds the lock (for the span)."""
    return True


class HoldKind(Acquiring, Guarding, Guarded[int]):
    """The base of every single-name kind (see the module docstring): the locks
    (:class:`LockKind`) and the semaphore's permits."""

    __slots__ = (
        "_counters",
        "_explicit_owner",
        "_keys",
        "_registry_key",
        "_services",
        "_state",
        "name",
    )

    def __init__(self, services: Services, name: str, owner: str | None) -> None:
        self._services = services
        self.name = name
        self._explicit_owner = owner
        # Held here: the cache keeps it only while some lock object of the name is alive.
        self._state = state = services.name_state(
            self.kind,
            name,
            lambda: NameState(self._build_keys(services, name), NameCounters()),
        )
        self._keys = state.keys
        self._counters = state.counters
        # What the client's registries know a hold by (its Redis key, for most kinds).
        self._registry_key = state.keys.lock + self._registry_suffix
        self._guards = None

    # -- acquiring ---------------------------------------------------------------------------

    @teaching
    def try_lock(
        self, wait: float | None = 0, lease: float | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Acquire the lock, waiting at most ``wait`` seconds (``None``: forever):
        ``await lock.try_lock(wait=5)``.

        :returns: ``True`` once held, ``False`` if ``wait`` ran out.

        The arguments are checked at the call; the coroutine it returns does the waiting (not a
        coroutine function, so a waiting task carries no frame of it).
        """
        wait_s, lease_s = check_wait(wait), check_lease(lease)
        return self._traced(self._try_lock(wait_s, lease_s), _held)

    async def _try_lock(self, wait: float | None, lease: float | None) -> bool:
        if wait is None:
            await self.wait_for_grant(lease)
            return True
        return await self.try_until(wait, lease)

    @teaching
    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Acquire the lock, waiting as long as it takes: ``await lock.lock()``.

        The arguments are checked at the call; the coroutine it returns does the waiting.
        """
        return self._traced(self.wait_for_grant(check_lease(lease)), _always)

    async def _enter(self, wait: float | None, lease: float | None) -> Holding[int]:
        return await self._traced(self._enter_untraced(wait, lease), _always)

    async def _enter_untraced(self, wait: float | None, lease: float | None) -> Hold:
        if wait is None:
            await self.wait_for_grant(lease)
        elif not await self.try_until(wait, lease):
            raise LockTimeoutError(f"could not acquire lock {self.name!r} within {wait}s")
        return self.caller_hold()

    def _traced(
        self, work: Coroutine[Any, Any, _T], granted: Callable[[_T], bool]
    ) -> Coroutine[Any, Any, _T]:
        """``work``, one acquire call of the calling owner, in an ``aiolock.acquire`` span
        when the client traces and a tracer provider may record (``granted(result)``: whether
        it holds the lock); else ``work`` itself, at no cost."""

        def holds_of(result: _T) -> tuple[Hold, ...]:
            if not granted(result):
                return ()
            hold = self._services.holds.get(self._registry_key, self.current_owner()[0])
            return () if hold is None else (hold,)

        return traced(self._services.tracing, work, self.kind, self.name, holds_of)

    @property
    def hash_tag(self) -> str:
        """The Redis Cluster hash tag of this lock's keys, with its braces (``{orders:42}``):
        put it in the keys of a :meth:`~aiolock.LockGuard.transaction`, so that on a Cluster
        they live in the lock's slot."""
        return hash_tag(self.name)

    async def _exit(self, holding: Holding[int]) -> None:
        assert isinstance(holding, Hold)
        # After a loss the release is not sent at all: it must not touch a lock somebody else
        # now holds (an explicit owner may have been granted the lock again).
        if not holding.check_lost():
            await self.release_one(holding.owner)

    # -- releasing ---------------------------------------------------------------------------

    @teaching
    async def unlock(self) -> None:
        """Release one hold.

        :raises LockNotOwnedError: if the calling owner does not hold the lock.

        If the connection fails, Redis' error propagates, but the release is not lost: it is
        no longer counted as held, and it is completed in the background (the owner's next
        acquire or release of this lock waits for it; ``is_held()`` does not).  If the server
        stays out of reach until the hold's lease has surely run out, the lease ends it
        instead.  Do not call ``unlock()`` again for it.
        """
        owner, _ = self.current_owner()
        if await self.release_one(owner) is None:
            what = f"lock {self.name!r}"
            if self.held_by_another_task(owner):
                raise LockNotOwnedError(held_by_another_task(what))
            raise LockNotOwnedError(f"{what} is not held by this owner")

    def held_by_another_task(self, owner: str) -> bool:
        """Whether ``owner``, a task that holds nothing, called where another owner of this
        client holds the lock (no I/O: the client's record of its holds), as a task does that
        releases a lock another task of the client took."""
        if self._explicit_owner is not None:
            return False
        return any(hold.owner != owner for hold in self._services.holds.by_key(self._registry_key))

    # -- inspecting --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """``True`` if anyone holds the lock."""
        return bool(await self.read("exists"))

    async def is_held(self) -> bool:
        """``True`` if the calling owner holds the lock."""
        return await self.hold_count() > 0

    async def hold_count(self) -> int:
        """The calling owner's reentrant count (0 if it does not hold the lock)."""
        owner, _ = self.current_owner()
        count = await self.read("hget", owner)
        return 0 if count is None else int(count)

    async def remaining_lease(self) -> float | None:
        """Seconds until the lock expires; ``None`` if it is not locked."""
        pttl = int(await self.read("pttl"))
        if pttl == -2:
            return None
        return math.inf if pttl == -1 else pttl / 1000

    async def read(self, what: str, *args: str) -> Any:
        """One read of the lock's key (``common/read.lua``), on the client's own connections."""
        calls = self._services.check_open().calls
        return await calls.run(_scripts.READ, (self._keys.lock,), (what, *args))

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock name from this client's view (no I/O)."""
        holds = self._services.holds.by_key(self._registry_key)
        counters = self._counters
        return LockStatistics(
            name=self.name,
            held=sum(hold.count for hold in holds),
            lost=counters.last_lost,
            waiters=counters.waiters,
            acquisitions=counters.acquisitions,
            renewals=counters.renewals,
            losses=counters.losses,
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        if stats.held:
            state = f"held x{stats.held}"
        elif stats.lost:
            state = "lost"
        else:
            state = "unlocked"
        extra = f", waiters:{stats.waiters}" if stats.waiters else ""
        owner = f" owner={self._explicit_owner!r}" if self._explicit_owner is not None else ""
        return f"<{type(self).__name__} {self.name!r}{owner} [{state}{extra}]>"

    # -- what the composites and the command line ask ----------------------------------------

    @property
    def explicit_owner(self) -> str | None:
        """The owner the lock was made for (``owner=``); ``None``: each calling task's own."""
        return self._explicit_owner

    @property
    def order(self) -> tuple[str, str]:
        """Where the lock stands in the one order every process takes locks in: its key, then
        its client's server (see :mod:`aiolock.multi`)."""
        return self._keys.lock, self._services.server

    def hold(self, owner: str) -> Hold | None:
        """The client's record of ``owner``'s hold on the lock, if it believes in one."""
        return self._services.holds.get(self._registry_key, owner)


class LockKind(HoldKind):
    """A kind whose holds can be ended whoever holds them: every lock kind (a semaphore has
    no ``force_unlock``, so its permits are a :class:`HoldKind` only)."""

    __slots__ = ()

    def _force_call(self) -> Call:
        """Delete the lock whoever holds it, and wake who may now get in (every lock kind
        supplies it)."""
        raise NotImplementedError

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; ``True`` if it existed."""
        services = self._services.check_open()
        deleted = await services.calls.run(*self._force_call())
        if deleted:
            services.holds.lose_all(self._registry_key, "it was force-unlocked")
        return bool(deleted)
