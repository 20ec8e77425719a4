"""The lock-kind base: what every lock kind shares, so that a kind is its scripts and little else.

:class:`LockKind` owns the wait loop, the settlement of calls whose outcome is unknown, guards
and ``async with``, loss reporting, statistics and the repr.  A kind supplies:

- its keys (:meth:`LockKind._build_keys`) and its scripts, as ready calls: an attempt
  (:meth:`_attempt`: a grant ``{token, count, pttl}`` or the seconds to wait before trying
  again, in ms), a release with an undo mode (:meth:`_release_call`), a force
  (:meth:`_force_call`), and the renew script the watchdog runs for its holds (``_renew``);
- how its waiters wait and wake (:meth:`_waiting`, see :mod:`aiolock._core.waiting`);
- optionally what a waiter that gives up must leave behind (:meth:`_gave_up`).

**The wait loop**, as in Redisson's ``RedissonLock.tryLock``: try; on failure park until a
wake-up or the pause the try returned (the lock's remaining lease, say) runs out; repeat until
the deadline.

**One rule for every state-changing call** (acquire, release): when its outcome is unknown to
its caller (the caller was cancelled, the connection was lost, the reply timed out), it is
settled in the background with the same request id (a grant is undone exactly, a release is
completed), and the owner's next acquire or release on that name waits for the settlement.
The invariant, per (name, owner): once settlements are done, the holds the client believes in
are holds the server has, or are marked lost; the server has no hold of that owner that the
client does not know about.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from redis.exceptions import RedisError, ResponseError

from .. import _scripts
from .._redis.calls import NotSent, not_sent
from .._scripts import Script
from ..errors import LockNotOwnedError, LockSyncError, LockTimeoutError
from .guard import Guarded, Holding
from .holds import Hold, NameCounters
from .keys import LockKeys, hash_tag
from .metrics import lock_extra
from .services import Services
from .transaction import TransactionContext
from .validate import check_lease, check_wait
from .waiting import Waiting

__all__ = ["Call", "LockKind", "LockStatistics", "NameState", "Seam", "Who", "release_args"]

logger = logging.getLogger("aiolock.lock")

_FAILURES: Final = (RedisError, OSError)

# How long past the lease end the client knows of a background release keeps trying: the
# server counts a lease from when it applied the call, which a stall may have delayed.
_SETTLE_MARGIN: Final = 1.0

_T = TypeVar("_T")

Call = tuple[Script, tuple[str, ...], tuple[Any, ...]]
"""A script call, ready to run: the script, its KEYS and its ARGV."""

Who = tuple[str, "asyncio.Task[Any] | None"]
"""An owner id and the task whose end stops the watchdog renewing its holds."""


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
    """What every lock object of one kind and name shares in a client: keys and counters."""

    keys: LockKeys
    counters: NameCounters


class LockKind(Guarded[int]):
    """The base of every single-name lock kind (see the module docstring)."""

    __slots__ = (
        "_counters",
        "_explicit_owner",
        "_hold_key",
        "_keys",
        "_services",
        "_state",
        "name",
    )

    kind: ClassVar[str]
    """The kind's name: part of its keys (so kinds never share keys) and of its registries."""
    _renew: ClassVar[Script]

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
        self._hold_key = self._registry_key()
        self._guards = None

    # -- what a kind supplies ----------------------------------------------------------------

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        return LockKeys.build(services.key_prefix, name, cls.kind, cluster=services.cluster)

    def _registry_key(self) -> str:
        """The key of this kind's holds in the client's registries (distinct per mode when
        one owner may hold the same lock in two modes)."""
        return self._keys.lock

    def _renew_keys(self) -> tuple[str, ...]:
        """The KEYS the kind's renew script takes for one hold."""
        return (self._keys.lock,)

    def _attempt(self, owner: str, request: int, lease_ms: int) -> Call:
        raise NotImplementedError

    def _release_call(self, owner: str, request: int, undo: int | None) -> Call:
        """Release one hold; with ``undo``, only if that acquire request was applied."""
        raise NotImplementedError

    def _force_call(self) -> Call:
        raise NotImplementedError

    def _transact_call(self, hold: Hold) -> Call:
        """The kind's check before a transaction's commands (``<kind>/transact.lua``): its
        script, the lock keys it reads, and its ARGV head (owner, fencing token).  By default
        the reentrant lock hash's, which the plain, spin and fair locks share."""
        return _scripts.LOCK_TRANSACT, (self._keys.lock,), (hold.owner, hold.token)

    def _void_call(self, owner: str, requests: list[int]) -> Call:
        """Void the owner's acquire ``requests`` (mark them as ones that must never grant) for
        the client's resend window: by default in the meta hash (``common/void.lua``), which
        the acquire scripts read."""
        window = self._services.resend_window_ms
        return (_scripts.VOID, (self._keys.meta,), (owner, window, *requests))

    def _waiting(self, owner: str) -> Waiting:
        raise NotImplementedError

    def _channels(self) -> tuple[str, ...]:
        """Where the client wakes one of its own waiters when a hold ends unpublished."""
        return ()

    def _released_last(self, hold: Hold | None) -> None:
        """A release of this client deleted the lock (``hold``: the client's record of it, if
        it had one).  A kind whose release publishes only when the server saw a waiter refused
        wakes its own parked waiters here: they may have been refused by an earlier
        incarnation of the lock (see ``lock/release.lua``)."""

    def _leave_call(self, owner: str) -> Call | None:
        """What a waiter that gives up sends, if its kind keeps waiters on the server."""
        return None

    def _gave_up(self, owner: str) -> None:
        """A waiting call left without the lock (timeout, cancellation, error).

        A kind that keeps its waiters on the server (a queue) has them leave at once.  Leaving
        is idempotent, so it is sent for every call that leaves without the lock, also one
        cancelled while its try (which may have queued it) was in flight: settled after that
        try, like the rest of the owner's pending work.
        """
        call = self._leave_call(owner)
        if call is not None:
            self._services.holds.defer(self._keys.lock, owner, self._leave(call))

    async def _leave(self, call: Call) -> None:
        # Sent also while the client closes: closing waits for it (see Client.aclose).
        await self._services.calls.run(*call)

    def _refusal(self, error: ResponseError) -> Exception | None:
        """The exception to raise for an attempt the script refused, if the kind has one."""
        return None

    async def _refused_for_unknown_holds(self, owner: str) -> bool:
        """Whether a refusal was caused by holds of the owner (a task) that the client did not
        know of, which are now released: the attempt is then made again.  Kinds whose scripts
        refuse because of the owner's own holds override it."""
        return False

    # -- acquiring ---------------------------------------------------------------------------

    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        """Acquire the lock, waiting at most ``wait`` seconds (``None``: forever).

        :returns: ``True`` once held, ``False`` if ``wait`` ran out.
        """
        wait_s, lease_s = check_wait(wait), check_lease(lease)
        return await self._traced(self._try_lock(wait_s, lease_s), lambda held: held)

    async def _try_lock(self, wait: float | None, lease: float | None) -> bool:
        if wait is None:
            await self._wait_for_grant(lease)
            return True
        return await self._try_until(wait, lease)

    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Acquire the lock, waiting as long as it takes: ``await lock.lock()``.

        The arguments are checked at the call; the coroutine it returns does the waiting (a
        plain function, so that a waiting task carries one coroutine frame fewer).
        """
        return self._traced(self._wait_for_grant(check_lease(lease)), lambda _: True)

    async def _enter(self, wait: float | None, lease: float | None) -> Holding[int]:
        return await self._traced(self._enter_untraced(wait, lease), lambda _: True)

    async def _enter_untraced(self, wait: float | None, lease: float | None) -> Hold:
        if wait is None:
            await self._wait_for_grant(lease)
        elif not await self._try_until(wait, lease):
            raise LockTimeoutError(f"could not acquire lock {self.name!r} within {wait}s")
        return self._granted()

    def _traced(
        self, work: Coroutine[Any, Any, _T], granted: Callable[[_T], bool]
    ) -> Coroutine[Any, Any, _T]:
        """``work``, one acquire call of the calling owner, in an ``aiolock.acquire`` span
        when the client traces (``granted(result)``: whether it holds the lock); else
        ``work`` itself, at no cost."""
        tracing = self._services.tracing
        if tracing is None:
            return work

        def hold_of(result: _T) -> Hold | None:
            if not granted(result):
                return None
            return self._services.holds.get(self._hold_key, self._owner()[0])

        return tracing.acquire(work, self.kind, self.name, hold_of)

    def _transaction(self, holding: Holding[int]) -> TransactionContext:
        assert isinstance(holding, Hold)
        services = self._services.check_open()
        return TransactionContext(
            name=self.name,
            hold=holding,
            check=self._transact_call(holding),
            calls=services.calls,
            holds=services.holds,
            table=services.command_table(),
            cluster=services.cluster,
        )

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
        if not holding.lost:
            await self._release(holding.owner)

    async def _acquire_as(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None
    ) -> Hold | float:
        """One attempt for an owner resolved by the caller (composites run parts concurrently,
        in tasks of their own, on behalf of the calling task)."""
        started = asyncio.get_running_loop().time()
        await self._services.holds.settle(self._keys.lock, owner)
        granted = False
        try:
            outcome = await self._try_acquire(owner, task, lease, started)
            granted = isinstance(outcome, Hold)
            return outcome
        finally:
            if not granted:
                self._gave_up(owner)

    # -- releasing ---------------------------------------------------------------------------

    async def unlock(self) -> None:
        """Release one hold.

        :raises LockNotOwnedError: if the calling owner does not hold the lock.

        If the connection fails, Redis' error propagates, but the release is not lost: it is
        no longer counted as held, and it is completed in the background (the owner's next
        acquire or release of this lock waits for it; ``is_held()`` does not).  If the server
        stays out of reach until the hold's lease has surely run out, the lease ends it
        instead.  Do not call ``unlock()`` again for it.
        """
        owner, _ = self._owner()
        if await self._release(owner) is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held by this owner")

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; ``True`` if it existed."""
        services = self._services.check_open()
        deleted = await services.calls.run(*self._force_call())
        if deleted:
            services.holds.lose_all(self._hold_key, "it was force-unlocked")
        return bool(deleted)

    # -- inspecting --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """``True`` if anyone holds the lock."""
        return bool(await self._read("exists"))

    async def is_held(self) -> bool:
        """``True`` if the calling owner holds the lock."""
        return await self.hold_count() > 0

    async def hold_count(self) -> int:
        """The calling owner's reentrant count (0 if it does not hold the lock)."""
        owner, _ = self._owner()
        count = await self._read("hget", owner)
        return 0 if count is None else int(count)

    async def remaining_lease(self) -> float | None:
        """Seconds until the lock expires; ``None`` if it is not locked."""
        pttl = int(await self._read("pttl"))
        if pttl == -2:
            return None
        return math.inf if pttl == -1 else pttl / 1000

    async def _read(self, what: str, *args: str) -> Any:
        """One read of the lock's key (``common/read.lua``), on the client's own connections."""
        calls = self._services.check_open().calls
        return await calls.run(_scripts.READ, (self._keys.lock,), (what, *args))

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock name from this client's view (no I/O)."""
        holds = self._services.holds.by_key(self._hold_key)
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

    # -- the wait loop -----------------------------------------------------------------------

    def _owner(self) -> tuple[str, asyncio.Task[Any] | None]:
        return self._services.check_open().owners.current(self._explicit_owner)

    def _try_until(
        self, wait: float, lease: float | None, who: Who | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Acquire within ``wait`` seconds: ``True`` once held, ``False`` when it ran out.

        ``wait=0`` is one attempt, however long that call takes.  Any other ``wait`` bounds the
        whole acquire, calls in flight included (a stalled server or a frozen connection cannot
        hold the caller past it): a grant that arrives after the deadline is undone in the
        background, as for a cancelled caller.  ``who``: an owner the caller names (a
        semaphore's permit), instead of the calling owner.

        A plain function that returns the coroutine: one frame fewer for every waiting task.
        """
        if wait == 0:
            return self._try_once(lease, who)
        deadline = asyncio.get_running_loop().time() + wait
        return self._wait_for_grant_until(lease, deadline, who)

    async def _try_once(self, lease: float | None, who: Who | None = None) -> bool:
        owner, task = self._owner() if who is None else who
        if isinstance(await self._acquire_as(owner, task, lease), Hold):
            return True
        self._timed_out()
        return False

    async def _wait_for_grant_until(
        self, lease: float | None, deadline: float, who: Who | None = None
    ) -> bool:
        try:
            async with asyncio.timeout_at(deadline) as timeout:
                await self._wait_for_grant(lease, who)
                return True
        except TimeoutError:
            if timeout.expired():
                self._timed_out()
                return False
            raise

    def _timed_out(self) -> None:
        """An acquire's ``wait`` ran out (the one place timeouts are counted)."""
        metrics = self._services.metrics
        if metrics is not None:
            metrics.timed_out(self.kind)

    def _granted(self) -> Hold:
        """The calling owner's hold, right after an acquire returned (no await in between)."""
        owner, _ = self._owner()
        hold = self._services.holds.get(self._hold_key, owner)
        if hold is None:  # the grant registers it: never, short of a bug
            raise RuntimeError(f"lock {self.name!r} was granted but is not registered")
        return hold

    async def _wait_for_grant(self, lease: float | None, who: Who | None = None) -> None:
        """The wait loop (see the module docstring); a caller with a deadline bounds it.

        The owner is the task that runs it, not the one that made the coroutine
        (``asyncio.create_task(lock.lock())`` acquires for the new task), unless ``who`` names
        one.
        """
        owner, task = self._owner() if who is None else who
        started = asyncio.get_running_loop().time()
        await self._services.holds.settle(self._keys.lock, owner)
        waiting = self._waiting(owner)
        granted = False
        try:
            pause = waiting.first_pause()
            while True:
                if pause is None:
                    outcome = await self._try_acquire(owner, task, lease, started)
                    if isinstance(outcome, Hold):
                        granted = True
                        return
                    pause = outcome
                waiter = waiting.park(pause)
                pause = None
                try:
                    await waiter
                except asyncio.CancelledError:
                    waiting.unpark(waiter)
                    raise
                waiting.woken()
        finally:
            waiting.leave(granted)
            if not granted:
                self._gave_up(owner)

    async def _try_acquire(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None, started: float
    ) -> Hold | float:
        """One attempt: the hold, or seconds to wait before the next (``inf``: no bound).

        ``started``: when the acquire call began (loop time), for the wait a fresh hold took.
        """
        while True:
            outcome = await self._attempt_once(owner, task, lease, started)
            if outcome is not None:
                return outcome

    async def _attempt_once(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None, started: float
    ) -> Hold | float | None:
        """:meth:`_try_acquire`'s one call; ``None``: it re-entered a stale hold, try again."""
        services = self._services
        lease_s = services.watchdog_timeout if lease is None else lease
        request = services.owners.next_request()
        sent_at = asyncio.get_running_loop().time()

        def unknown(work: asyncio.Future[Any]) -> None:
            # A grant that the caller will never see is undone, exactly that one.
            self._settle_later(
                owner,
                work,
                lambda: self._undo_if_granted(work, owner, request, lease_s, resent=resent),
            )

        resent = False

        def sending(resend: bool) -> None:
            # The reply's lease runs from when the server ran the copy that answered (a resend
            # too: the scripts restart its lease), which was written now: a reconnect or a
            # retry's backoff before it must not eat into the lease the client counts.
            nonlocal resent, sent_at
            resent = resent or resend
            sent_at = asyncio.get_running_loop().time()

        call = self._attempt(owner, request, round(lease_s * 1000))
        try:
            reply, synced = await services.calls.run_synced(
                *call,
                sync=services.sync,
                orphan=unknown,
                on_send=sending,
                mark_resends=services.resend_window_ms,
            )
        except ResponseError as error:
            refusal = self._refusal(error)
            if refusal is None:
                raise
            if task is not None and await self._refused_for_unknown_holds(owner):
                return None
            raise refusal from None
        if not isinstance(reply, list):
            # A resend that was refused voided its request itself: its first copy may still
            # arrive, and must not grant once the lock is free.
            pttl = int(reply)
            counters = self._counters
            counters.refused_sent_at = max(counters.refused_sent_at, sent_at)
            return math.inf if pttl < 0 else pttl / 1000
        holds = services.holds
        if services.sync is not None and synced < services.sync[0]:
            # Not on enough replicas in time: a failover could forget it.  Undo exactly this
            # grant (a settlement: the caller may be cancelled meanwhile), then say so.
            undo = services.owners.next_request()
            until = asyncio.get_running_loop().time() + lease_s
            holds.defer(self._keys.lock, owner, self._retry_release(owner, undo, request, until))
            await holds.settle(self._keys.lock, owner)
            raise LockSyncError(
                f"{synced} of the {services.sync[0]} replica(s) asked for confirmed the grant of "
                f"{self.name!r} within {services.sync[1]}s; it was undone"
            )
        count = int(reply[1])
        if count > 1 and holds.get(self._hold_key, owner) is None:
            # The server has more holds of this owner than the client knows of: a grant the
            # client never saw (a late copy of an earlier request, applied after its resend was
            # answered), or the very hold the client already took for lost (its deadlines run
            # a little ahead of the server's).  The unknown holds are dropped as a settlement
            # (a cancelled caller leaves none behind).
            if holds.lost_token(self._hold_key, owner) == int(reply[0]):
                # Its token was handed out before: not a fresh grant.  Drop them all, retry.
                holds.defer(self._keys.lock, owner, self._drop_holds(owner, count))
                await holds.settle(self._keys.lock, owner)
                return None
            logger.warning(
                "%s %r: the server had %d hold(s) of this owner the client never saw (a late "
                "copy of an earlier request); releasing them",
                self.kind,
                self.name,
                count - 1,
                extra=lock_extra(self.kind, self.name, owner),
            )
            holds.defer(self._keys.lock, owner, self._drop_holds(owner, count - 1))
            reply = [reply[0], 1, reply[2]]  # this grant is the owner's one hold
        hold = services.holds.record_grant(
            name=self.name,
            kind=self.kind,
            key=self._hold_key,
            owner=owner,
            reply=reply,
            sent_at=sent_at,
            started=started,
            watchdog=lease is None,
            counters=self._counters,
            task=task,
            renew=self._renew,
            renew_keys=self._renew_keys(),
            channels=self._channels(),
        )
        if resent:
            if not hold.resent:
                hold.listeners.append(lambda: self._void_lost(hold))
            hold.resent.append(request)  # its first copy may still arrive, after the release
        if hold.watchdog:
            services.watchdog.start()
        return hold

    # -- releasing and settling --------------------------------------------------------------

    async def _release(self, owner: str) -> int | None:
        """Release one hold: the holds left, or ``None`` if the owner held none.

        The release completes even if the caller is cancelled or the reply is lost.
        """
        services = self._services
        key = self._hold_key
        request = services.owners.next_request()

        def unknown(work: asyncio.Future[Any]) -> None:
            # Not kept as held from now on: the watchdog would renew a hold that may be gone,
            # and the next acquire would silently re-enter it.  How long the hold may live is
            # read first: untracked, its lease is no longer known.
            until = self._lease_end(owner)
            self._untrack_one(owner)
            self._settle_later(
                owner, work, lambda: self._release_outcome(work, owner, request, until)
            )

        try:
            await services.holds.settle(self._keys.lock, owner)
        except asyncio.CancelledError:
            unknown(not_sent())
            raise
        hold = services.holds.get(key, owner)
        believed = None if hold is None else hold.count - 1
        if hold is not None and believed == 0 and hold.resent:
            # In the background, like a settlement: a cancellation of this call must not lose
            # it (the release is then settled after it).
            voided, hold.resent = hold.resent, []
            services.holds.defer(self._keys.lock, owner, self._void(owner, voided))
            try:
                await services.holds.settle(self._keys.lock, owner)
            except asyncio.CancelledError:
                unknown(not_sent())
                raise
        resent = False

        def sending(resend: bool) -> None:
            nonlocal resent
            resent = resent or resend

        # While it is in flight, a renewal of this hold may be answered "not held" because of
        # it: the watchdog leaves the verdict to this reply (Holds.in_release).
        sent = asyncio.get_running_loop().time()
        with services.holds.releasing(key, owner):
            reply = await services.calls.run(
                *self._release_call(owner, request, None), orphan=unknown, on_send=sending
            )
        remaining = _remaining(reply)
        if remaining is None and resent and believed == 0 and hold and sent < hold.expires_at:
            # No marker outlives the lock, so a resend of the release that deleted it finds it
            # gone.  The owner's critical section ended before it sent the release, and its
            # lease had not run out as the client counts: only a force_unlock or a failover in
            # between would have made it a loss, and either reports itself to its own caller.
            remaining = 0
        services.holds.released(key, owner, remaining)
        self._check_count(owner, believed, remaining)
        if remaining == 0:
            self._released_last(hold)
        return remaining

    async def _void(self, owner: str, requests: list[int]) -> None:
        """Void the owner's resent acquire ``requests``: late copies of them grant nothing once
        the owner does not hold the lock (:meth:`_void_call`).  A resend voids itself in its
        own script (``mark_resends`` in ``Calls.run``), for the resend window; a hold may
        outlive that, so this runs again before the release that ends a hold whose acquires
        were resent, when such a hold is lost, and in the settlement of a resent call whose
        caller left.

        Without it, a copy arriving after another owner's release replaced the marker of the
        owner's own last release would grant a hold nobody knows of.  A failure is logged and
        the caller goes on: the lease still bounds such a hold.
        """
        try:
            await self._services.calls.run(*self._void_call(owner, requests))
        except _FAILURES as exc:
            logger.warning(
                "could not void %d resent acquire(s) of %r: %r",
                len(requests),
                self.name,
                exc,
                extra=lock_extra(self.kind, self.name, owner),
            )

    def _void_lost(self, hold: Hold) -> None:
        """A hold whose acquires were resent was lost (its lease ran out, it was forced): no
        release will void them, so it is done now, in the background."""
        if hold.resent:
            voided, hold.resent = hold.resent, []
            void = self._void(hold.owner, voided)
            self._services.holds.defer(self._keys.lock, hold.owner, void)

    def _check_count(self, owner: str, believed: int | None, remaining: int | None) -> None:
        """A release left more holds on the server than the client knew of: drop the extra.

        Left by a background release that gave up (logged as a warning), else a bug signal
        (logged as an error).  Either way the holds nobody knows of
        are released in the background, so that neither the watchdog nor a later acquire ever
        treats them as the owner's.
        """
        if remaining is None or remaining <= (believed or 0):
            return
        extra = remaining - (believed or 0)
        abandoned = self._services.holds.was_abandoned(self._keys.lock, owner)
        logger.log(
            logging.WARNING if abandoned else logging.ERROR,
            "lock %r: the server has %d hold(s) of this owner that the client did not know "
            "of%s; releasing them",
            self.name,
            extra,
            " (left by a release that gave up)" if abandoned else "",
            extra=lock_extra(self.kind, self.name, owner),
        )
        self._services.holds.defer(self._keys.lock, owner, self._drop_holds(owner, extra))

    async def _drop_all(self, owner: str) -> bool:
        """Release every hold of ``owner`` on the server (holds its client did not know of);
        ``True`` once none is left, ``False`` if a release failed."""
        services = self._services
        while True:
            request = services.owners.next_request()
            try:
                reply = await services.calls.run(*self._release_call(owner, request, None))
            except _FAILURES as exc:
                logger.warning(
                    "could not release %r in the background: %r",
                    self.name,
                    exc,
                    extra=lock_extra(self.kind, self.name, owner),
                )
                return False
            if not _remaining(reply):
                return True

    async def _drop_holds(self, owner: str, count: int) -> None:
        for _ in range(count):
            request = self._services.owners.next_request()
            until = asyncio.get_running_loop().time() + self._services.watchdog_timeout
            await self._retry_release(owner, request, None, until)

    def _settle_later(
        self,
        owner: str,
        work: asyncio.Future[Any],
        settle: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        """Once the call ``work`` whose outcome its caller never saw is over, ``settle()`` it.

        Registered at once, so the owner's next acquire or release on this name waits for it
        (in any mode: settlements are keyed by the lock, not by the registry key).
        """

        async def when_done() -> None:
            await asyncio.wait([work])
            if not work.cancelled():  # cancelled: the client is closing
                await settle()

        self._services.holds.defer(self._keys.lock, owner, when_done())

    async def _release_outcome(
        self, work: asyncio.Future[Any], owner: str, request: int, until: float
    ) -> None:
        """Settle a release with an unknown outcome: record it, or resend it until it lands
        (or the hold surely ended: ``until``, loop time)."""
        if work.exception() is None:
            self._services.holds.released(self._hold_key, owner, _remaining(work.result()))
            return
        await self._retry_release(owner, request, None, until)

    async def _undo_if_granted(
        self,
        work: asyncio.Future[Any],
        owner: str,
        acquire_request: int,
        lease: float,
        *,
        resent: bool = False,
    ) -> None:
        failure = work.exception()
        if isinstance(failure, NotSent):
            return
        if resent:
            await self._void(owner, [acquire_request])  # a first copy may still arrive
        if failure is None and not isinstance(work.result(), list):
            return  # the lock was busy: nothing was granted
        # Granted, or failed with an unknown outcome: undo exactly that request, if it landed.
        request = self._services.owners.next_request()
        until = max(asyncio.get_running_loop().time() + lease, self._lease_end(owner))
        await self._retry_release(owner, request, acquire_request, until)

    def _untrack_one(self, owner: str) -> None:
        """Stop counting one hold whose release has an unknown outcome."""
        holds = self._services.holds
        hold = holds.get(self._hold_key, owner)
        if hold is not None:
            if hold.count > 1:
                hold.count -= 1
            else:
                holds.forget(hold)

    def _lease_end(self, owner: str) -> float:
        """Until when (loop time) a settlement keeps resending: the owner's hold's lease end as
        the client knows it, and no earlier than a watchdog lease from now."""
        hold = self._services.holds.get(self._hold_key, owner)
        until = asyncio.get_running_loop().time() + self._services.watchdog_timeout
        return until if hold is None else max(until, hold.expires_at)

    async def _retry_release(
        self, owner: str, request: int, undo: int | None, until: float
    ) -> None:
        """Send one (idempotent) release until it lands, the lease surely ran out, or close.

        Giving up is safe only because every hold it may concern has a lease: the server ends
        it by itself, by ``until`` (loop time) as the client counts.  The server may count from
        later (a call it applied late, after a stall), hence the margin; a hold that outlives
        even that is recorded as abandoned, so that meeting it later is not taken for a bug.
        """
        services = self._services
        loop = asyncio.get_running_loop()
        give_up = until + _SETTLE_MARGIN
        delay = 0.02
        script, keys, args = self._release_call(owner, request, undo)
        if undo is not None:
            # An undo that finds its acquire unapplied writes a marker: for the resend window.
            args = (*args, services.resend_window_ms)
        while True:
            try:
                reply = await services.calls.run(script, keys, args)
            except _FAILURES as exc:
                # The last try is at the horizon, not a backoff step before it: a settlement
                # that ends early would let the owner's next call meet the hold it was undoing.
                now = loop.time()
                if services.closed or now >= give_up:
                    logger.warning(
                        "gave up releasing %r in the background: %r",
                        self.name,
                        exc,
                        extra=lock_extra(self.kind, self.name, owner),
                    )
                    services.holds.abandoned(self._keys.lock, owner)
                    return
                await asyncio.sleep(min(delay, give_up - now))
                delay = min(delay * 2, 1.0)
                continue
            services.holds.released(self._hold_key, owner, _remaining(reply))
            if reply == 0:
                self._released_last(None)
            return


class Seam:
    """All that code outside a lock kind may ask of one lock object: the declared interface.

    The composites (``MultiLock``, ``RedLock``), the semaphore's permits, the read-write lock's
    modes, the command line and the tests go through it, never through the kind's underscore
    names, so a kind can change inside without reading all of them.  It is internal: the
    public calls are the lock's own.
    """

    __slots__ = ("lock",)

    def __init__(self, lock: LockKind) -> None:
        self.lock = lock

    @property
    def keys(self) -> LockKeys:
        """The lock's Redis keys."""
        return self.lock._keys

    @property
    def services(self) -> Services:
        """The services of the lock's client."""
        return self.lock._services

    @property
    def registry_key(self) -> str:
        """What the client's registries know the lock's holds by (distinct per mode)."""
        return self.lock._hold_key

    @property
    def order(self) -> tuple[str, str]:
        """Where the lock stands in the one order every process takes locks in: its key, then
        its client's server (see :mod:`aiolock.multi`)."""
        return self.lock._keys.lock, self.lock._services.server

    def owner(self) -> Who:
        """The calling owner: the lock's explicit owner, or the current task's."""
        return self.lock._owner()

    def hold(self, owner: str) -> Hold | None:
        """The client's record of ``owner``'s hold on the lock, if it believes in one."""
        return self.lock._services.holds.get(self.registry_key, owner)

    def held(self) -> Hold:
        """The calling owner's hold, right after an acquire returned (no await in between)."""
        return self.lock._granted()

    def wait_for_grant(
        self, lease: float | None, who: Who | None = None
    ) -> Coroutine[Any, Any, None]:
        """Acquire, waiting as long as it takes (for ``who``, else the calling owner)."""
        return self.lock._wait_for_grant(lease, who)

    def try_until(
        self, wait: float, lease: float | None, who: Who | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Acquire within ``wait`` seconds (``0``: one attempt); ``True`` once held."""
        return self.lock._try_until(wait, lease, who)

    def acquire_as(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None
    ) -> Coroutine[Any, Any, Hold | float]:
        """One attempt for ``owner`` (resolved by the caller, for a part taken in a task of its
        own): the hold, or the seconds to wait before the next."""
        return self.lock._acquire_as(owner, task, lease)

    def release(self, owner: str) -> Coroutine[Any, Any, int | None]:
        """Release one hold of ``owner``: the holds left, ``None`` if it held none."""
        return self.lock._release(owner)

    def drop_all(self, owner: str) -> Coroutine[Any, Any, bool]:
        """Release every hold of ``owner`` on the server; ``True`` once none is left."""
        return self.lock._drop_all(owner)

    def read(self, what: str, *args: str) -> Coroutine[Any, Any, Any]:
        """One read of the lock's key (``common/read.lua``: exists, hget, pttl...)."""
        return self.lock._read(what, *args)


def release_args(owner: str, request: int, undo: int | None) -> tuple[Any, ...]:
    """ARGV of every kind's release script: owner, request, and the acquire to undo, if any."""
    return (owner, request) if undo is None else (owner, request, undo)


def _remaining(reply: Any) -> int | None:
    """A release script reply: holds left, or ``None`` when the owner did not hold the lock."""
    return None if reply is None else int(reply)
