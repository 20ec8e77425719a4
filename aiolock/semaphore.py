"""``AsyncSemaphore``: at most N holders across all clients, each holding a leased permit.

Redisson's ``RPermitExpirableSemaphore`` for asyncio.  The permits are a sorted set of permit
ids scored by the server time at which each lease ends; a permit past its lease is dropped by
the next call that looks, so a crashed holder's permit comes back by itself, and a waiter that
found none free tries again when the earliest lease ends (with no message).  A release wakes
one waiter, parked on the semaphore's channel as for the plain lock.

Each acquisition is an owner of its own (the permit id) on the shared base
(:mod:`aiolock._core.kind`), so a cancelled or failed acquire is undone and a release with a lost
reply completed exactly as for the locks, and ``lease=None`` permits are renewed by the
client's watchdog while the task that took them lives.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from redis.asyncio.client import Pipeline

from . import _scripts
from ._core.guard import LockGuard
from ._core.habits import not_awaitable, teaching
from ._core.holds import Hold
from ._core.hooks import Call, release_args
from ._core.inspection import Holder, ServerState, Snapshot, as_str, seconds, server_ms
from ._core.keys import LockKeys, hash_tag, marks_of
from ._core.kind import HoldKind
from ._core.metrics import traced
from ._core.services import Services
from ._core.settlement import Attempt
from ._core.state import LockStatistics
from ._core.validate import check_lease, check_permits, check_wait
from ._core.waiting import ChannelWait, WaitStrategy
from .errors import LockLostError, LockNotOwnedError, LockTimeoutError

if TYPE_CHECKING:
    from ._core.transaction import Transaction

__all__ = ["AsyncSemaphore", "Permit", "describe", "permits_of"]


class _Permits(HoldKind):
    """The semaphore's machinery: a kind whose every owner is one permit (it has no force)."""

    __slots__ = ("limit",)

    kind: ClassVar[str] = "semaphore"
    _renew = _scripts.SEMAPHORE_RENEW
    _ends_with_task = False  # any task may release a permit

    def __init__(self, services: Services, name: str, limit: int) -> None:
        super().__init__(services, name, None)
        self.limit = limit

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        return (
            _scripts.SEMAPHORE_ACQUIRE,
            (self._keys.lock, self._marks),
            (lease_ms, owner, request, self.limit),
        )

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        keys = self._keys
        return (
            _scripts.SEMAPHORE_RELEASE,
            (keys.lock, self._marks, keys.channel),
            release_args(owner, request, undo),
        )

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        # ``semaphore/acquire.lua`` answers {0, 1, lease left} for a grant; {-1, count} when
        # the count kept differs from this caller's, and a number of ms when all are taken.
        return reply if isinstance(reply, list) and reply[0] == 0 else None

    def _refusal_pause(self, attempt: Attempt, reply: Any) -> float:
        if isinstance(reply, list):  # {-1, count}: nothing was granted
            raise ValueError(
                f"semaphore {self.name!r} has {reply[1]} permits on the server; this caller "
                f"asked for {self.limit} (use set_permits() to change it for everyone)"
            )
        return super()._refusal_pause(attempt, reply)

    def _transact_call(self, hold: Hold) -> Call:
        # The permit id is unique per acquisition: it tells this permit from any later one.
        return _scripts.SEMAPHORE_TRANSACT, (self._keys.lock,), (hold.owner, 0)

    def _extend_call(self, hold: Hold, lease_ms: int) -> Call:
        return _scripts.SEMAPHORE_EXTEND, (self._keys.lock,), (lease_ms, hold.owner)

    def void_call(self, owner: str, requests: list[int]) -> Call:
        window = self._services.resend_window_ms
        return (_scripts.SEMAPHORE_VOID, (self._marks,), (owner, window, *requests))

    @property
    def _marks(self) -> str:
        """The void marks' key (written after a fault only, for the resend window: see
        ``scripts/semaphore/_permits.lua``), in the permits' slot."""
        return marks_of(self._keys)

    def _channels(self) -> tuple[str, ...]:
        return (self._keys.channel,)

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        return ChannelWait(
            self._services, self._keys.channel, self._counters, reentering=False, shared=True
        )


class AsyncSemaphore:
    """At most ``permits`` holders at once, across every client of the same Redis and ``name``.

    Create it with :meth:`aiolock.Client.semaphore`::

        downstream = client.semaphore("payments-api", 5)
        async with downstream.acquire(wait=5) as permit:   # LockTimeoutError after 5 s
            await call_payments_api()

    A permit's lease works like a lock's: ``lease=None`` has the watchdog renew it while the
    task that took it lives, a number of seconds makes it expire.  An expired permit returns to
    the pool by itself.  Not reentrant: every acquisition takes one more permit.

    The count is kept with the permits in Redis while anyone holds one: the first acquirer
    while none is held sets it, and an acquirer whose ``permits`` differs gets
    :class:`ValueError` naming both counts, with nothing granted (so a rolling deploy that
    changes the count cannot admit more holders than either count).  :meth:`set_permits`
    changes it for everyone.
    """

    __slots__ = ("_permits", "name", "permits")

    def __init__(self, services: Services, name: str, permits: int) -> None:
        self.name = name
        self.permits = permits
        self._permits = _Permits(services, name, permits)

    @teaching
    def acquire(self, wait: float | None = None, lease: float | None = None) -> _PermitContext:
        """An async context manager that holds a permit for its block and yields it.

        Raises :class:`~aiolock.LockTimeoutError` when ``wait`` runs out; the exit releases the
        permit, and raises :class:`~aiolock.LockLostError` if its lease ran out meanwhile.
        """
        return _PermitContext(self, check_wait(wait), check_lease(lease))

    @teaching
    async def try_acquire(
        self, wait: float | None = 0, lease: float | None = None
    ) -> Permit | None:
        """A permit, waiting at most ``wait`` seconds (``None``: forever), or ``None``."""
        return await self._take(check_wait(wait), check_lease(lease))

    async def _take(self, wait: float | None, lease: float | None) -> Permit | None:
        permits = self._permits
        services = permits.services.check_open()
        taking = self._take_as(services, wait, lease)
        return await traced(
            services.tracing,
            taking,
            permits.kind,
            self.name,
            lambda permit: () if permit is None else (permit._hold,),
        )

    async def _take_as(
        self, services: Services, wait: float | None, lease: float | None
    ) -> Permit | None:
        permits = self._permits
        owners = services.owners
        who = (f"{owners.client_id}:p{owners.next_request()}", owners.holder_task())
        if wait is None:
            await permits.wait_for_grant(lease, who)
        elif not await permits.try_until(wait, lease, who):
            return None
        hold = permits.hold(who[0])
        if hold is None:  # the grant registers it: never, short of a bug
            raise RuntimeError(f"semaphore {self.name!r} granted a permit it did not register")
        return Permit(self, hold, LockGuard(self._permits, hold))

    @property
    def hash_tag(self) -> str:
        """The Redis Cluster hash tag of the semaphore's keys, with its braces: put it in the
        keys of a permit's :meth:`~Permit.transaction` (see :attr:`aiolock.AsyncRLock.hash_tag`)."""
        return hash_tag(self.name)

    async def available(self) -> int:
        """How many permits are free now, by the count kept on the server (this caller's
        ``permits`` while nobody holds one)."""
        machinery = self._permits
        held, kept = await machinery.services.check_open().calls.run(
            _scripts.SEMAPHORE_HELD, (machinery.keys.lock,), ()
        )
        return max((int(kept) or self.permits) - int(held), 0)

    async def set_permits(self, permits: int) -> None:
        """Change the count for everyone, and for this object's later acquires.

        Holders above a lower count keep their permits until they release; nobody new is
        admitted until fewer are held.  A higher count wakes as many waiters as it frees
        permits.  While nobody holds a permit no count is kept: the next acquirer's sets it.

        :raises TypeError: if ``permits`` is not an ``int``.
        :raises ValueError: if it is less than 1 or more than 10**12 (both before any I/O).
        """
        permits = check_permits(permits)
        keys = self._permits.keys
        services = self._permits.services.check_open()
        # First: the waiters of this object that the call wakes must try with the new count.
        self.permits = self._permits.limit = permits
        await services.calls.run(
            _scripts.SEMAPHORE_SET_PERMITS, (keys.lock, keys.channel), (permits,)
        )

    def statistics(self) -> LockStatistics:
        """This client's view (no I/O): ``held`` counts its permits, ``waiters`` its tasks."""
        return self._permits.statistics()

    def __repr__(self) -> str:
        stats = self.statistics()
        extra = f", waiters:{stats.waiters}" if stats.waiters else ""
        return f"<AsyncSemaphore {self.name!r} [held:{stats.held}/{self.permits}{extra}]>"


def permits_of(semaphore: AsyncSemaphore) -> HoldKind:
    """The lock kind behind a semaphore's permits (each permit id one owner of it)."""
    return semaphore._permits


def hold_of(permit: Permit) -> Hold:
    """The client's record of ``permit``'s hold (kept by the permit after it ended: its
    ``lost_reason`` says why it was lost)."""
    return permit._hold


class Permit:
    """One permit of an :class:`AsyncSemaphore`.

    :ivar id: the permit's id (unique across clients).
    :ivar lost: ``True`` once its lease ran out (or the watchdog found it gone).
    """

    __slots__ = ("_guard", "_hold", "semaphore")

    def __init__(self, semaphore: AsyncSemaphore, hold: Hold, guard: LockGuard[int]) -> None:
        self.semaphore = semaphore
        self._hold = hold
        self._guard = guard  # the permit as a hold of the semaphore's machinery

    @property
    def id(self) -> str:
        return self._hold.owner

    @property
    def lost(self) -> bool:
        return self._hold.check_lost()

    def valid_for(self) -> float:
        """Seconds for which the permit is surely still held, by this client's conservative
        clock (no I/O); ``0.0`` once lost or released (see
        :meth:`aiolock.LockGuard.valid_for`)."""
        return self._guard.valid_for()

    async def extend(self, lease: float) -> None:
        """Make the permit last ``lease`` seconds from now, longer or shorter than before (see
        :meth:`aiolock.LockGuard.extend`): :class:`~aiolock.LockLostError` if it is no longer
        held, :class:`ValueError` if it was taken with ``lease=None`` (the watchdog renews it)."""
        await self._guard.extend(lease)

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """Commands that run only while the permit is held, in one atomic call (see
        :meth:`aiolock.LockGuard.transaction`): if its lease ran out meanwhile none runs and
        :class:`~aiolock.LockLostError` is raised."""
        return self._guard.transaction()

    async def release(self) -> None:
        """Give the permit back and wake a waiter; any task may call it.

        :raises LockNotOwnedError: if the permit was no longer held (its lease ran out, or it
            was released already).
        """
        permits = self.semaphore._permits
        permits.services.check_loop()
        if await permits.release_one(self.id) is None:
            raise LockNotOwnedError(f"permit {self.id!r} of {self.semaphore.name!r} is not held")

    def __repr__(self) -> str:
        state = "lost" if self._hold.lost else "held"
        return f"<Permit {self.id!r} of {self.semaphore.name!r} [{state}]>"


class _PermitContext:
    """The async context manager behind :meth:`AsyncSemaphore.acquire`."""

    __slots__ = ("_lease", "_permit", "_semaphore", "_wait")

    def __init__(self, semaphore: AsyncSemaphore, wait: float | None, lease: float | None) -> None:
        self._semaphore = semaphore
        self._wait = wait
        self._lease = lease
        self._permit: Permit | None = None

    if not TYPE_CHECKING:  # a type checker refuses the await as it is: no awaitable to see

        def __await__(self):
            raise TypeError(
                not_awaitable(
                    "AsyncSemaphore.acquire()",
                    "use `async with sem.acquire(...) as permit:`, which gives the permit back "
                    "at the end of the block, or `permit = await sem.try_acquire(...)` and then "
                    "`await permit.release()`",
                )
            )

    async def __aenter__(self) -> Permit:
        if self._permit is not None:
            raise RuntimeError("this acquire() context is already in use")
        permit = await self._semaphore._take(self._wait, self._lease)
        if permit is None:
            raise LockTimeoutError(f"no permit of {self._semaphore.name!r} within {self._wait}s")
        self._permit = permit
        return permit

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        permit, self._permit = self._permit, None
        assert permit is not None, "__aexit__ without __aenter__"
        if not permit.lost:
            await self._semaphore._permits.release_one(permit.id)
        if not permit.lost:
            return False
        message = f"permit {permit.id!r} of {self._semaphore.name!r} was lost while held"
        if exc is None:
            raise LockLostError(f"{message}: {permit._hold.lost_reason}")
        exc.add_note(f"aiolock: {message}")
        return False


async def describe(keys: LockKeys, snapshot: Snapshot) -> ServerState:
    """The semaphore's permits taken now, for ``aiolock inspect`` (the server does not keep
    the limit: the caller knows it); a permit has no fencing token."""

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.zrange(keys.lock, 0, -1, withscores=True)

    (time, taken), subscribers = await snapshot(reads, (keys.channel,))
    now = server_ms(time)
    # See scripts/semaphore/_permits.lua: permit id -> the server ms at which its lease ends.
    holders = [
        Holder(as_str(permit), 1, seconds(ends - now), None) for permit, ends in taken if ends > now
    ]
    return ServerState(holders, None, subscribers=subscribers)
