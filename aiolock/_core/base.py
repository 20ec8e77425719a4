"""The kind base: what every kind shares, so that a kind is its scripts and little else.

:class:`HoldKind` owns the public calls, the wait loop, guards and ``async with``, loss
reporting, statistics and the repr; :class:`LockKind` adds ``force_unlock``, which every lock
kind has and the semaphore's permits have not.  A kind supplies:

- its keys (:meth:`HoldKind._build_keys`) and its scripts, as ready calls: an attempt
  (:meth:`_attempt`: a grant ``{token, count, pttl}`` or the seconds to wait before trying
  again, in ms; a kind whose script answers in a shorter form reads it in :meth:`_grant_of` and
  :meth:`_busy`), a release with an undo mode (:meth:`_release_call`), a force for a lock
  (:meth:`_force_call`), and the renew script the watchdog runs for its holds (``_renew``);
- how its waiters wait and wake (:meth:`_waiting`, see :mod:`aiolock._core.waiting`);
- optionally how a waiter that gives up withdraws from the server (:meth:`_withdraw_call`).

**The wait loop**, as in Redisson's ``RedissonLock.tryLock``: try; on failure park until a
wake-up or the pause the try returned (the lock's remaining lease, say) runs out; repeat until
the deadline.

Calls whose outcome their caller never saw are settled by :mod:`aiolock._core.settlement`
(one rule for every state-changing call, and the invariant it keeps), which asks the lock
through its :class:`Seam`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from redis.exceptions import RedisError

from .. import _scripts
from .._redis.calls import not_sent
from .._scripts import Call, Script
from ..errors import LockLostError, LockNotOwnedError, LockTimeoutError
from .guard import Guarded, Holding
from .habits import held_by_another_task, teaching
from .holds import CLOCK_MARGIN, Hold, NameCounters
from .keys import LockKeys, hash_tag
from .metrics import traced
from .services import Services
from .settlement import Attempt, Copies, Settlement, holds_left, until_it_lands
from .transaction import TransactionContext
from .validate import check_lease, check_wait
from .waiting import MessageGrant, Waiting

__all__ = [
    "Call",
    "HoldKind",
    "LockKind",
    "LockStatistics",
    "NameState",
    "Seam",
    "Who",
    "release_args",
]

_T = TypeVar("_T")

logger = logging.getLogger("aiolock.lock")

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
    """What every lock object of one kind and name shares in a client: keys, counters, and
    the waiting calls of explicit owners."""

    keys: LockKeys
    counters: NameCounters
    # owner -> its calls in the wait loop, for the explicit owners that have some: two tasks
    # may share an owner, and a grant to one of its calls is a reentrant grant for the others.
    waiting: dict[str, list[Waiting]] | None = None

    def join(self, owner: str, waiting: Waiting) -> None:
        calls = self.waiting
        if calls is None:
            calls = self.waiting = {}
        calls.setdefault(owner, []).append(waiting)

    def others_wait(self, owner: str) -> bool:
        """Whether ``owner`` has more than one call in the wait loop."""
        return self.waiting is not None and len(self.waiting.get(owner, ())) > 1

    def leave(self, owner: str, waiting: Waiting, *, granted: bool) -> None:
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


class HoldKind(Guarded[int]):
    """The base of every single-name kind (see the module docstring): the locks
    (:class:`LockKind`) and the semaphore's permits."""

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
    _ends_with_task: ClassVar[bool] = True
    """Whether a task-owned hold is released when its task ends (SPEC); a semaphore's permit,
    which any task may release, keeps the lease rule."""
    _publishes_if_refused: ClassVar[bool] = False
    """Whether the kind's release publishes only when the server refused a waiter since the
    grant (``lock/release.lua``), rather than always: see :meth:`_released_last`."""

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
        """One try: its script answers a grant or the PTTL to wait (see :meth:`_grant_of`)."""
        raise NotImplementedError

    def _release_call(self, owner: str, request: int, undo: int | None) -> Call:
        """Release one hold; with ``undo``, only if that acquire request was applied."""
        raise NotImplementedError

    def _plain_release(self, hold: Hold) -> tuple[Any, ...] | None:
        """A plain command that ends ``hold``, its owner's last and fault-free (no acquire of
        it resent, no release of the owner's resent lately), for a kind whose hold fields are
        all named by their owner; ``None`` for a release script (the default).  Its reply is
        the number of fields it removed: 3 or more when the hold was there (see
        :meth:`_release_plainly`).  A kind whose lock must be handed over in the same call
        (the fair lock) answers a :data:`Call` of a script with the same reply."""
        return None

    def _transact_call(self, hold: Hold) -> Call:
        """The kind's check before a transaction's commands (``<kind>/transact.lua``): its
        script, the lock keys it reads, and its ARGV head (owner, fencing token).  By default
        the reentrant lock hash's, which the plain, spin and fair locks share."""
        return _scripts.LOCK_TRANSACT, (self._keys.lock,), (hold.owner, hold.token)

    def _extend_call(self, hold: Hold, lease_ms: int) -> Call:
        """The kind's extend (``<kind>/extend.lua``): set ``hold``'s lease to ``lease_ms`` from
        now if its owner still holds it with its fencing token; answers 1, or 0 when not held.
        By default the reentrant lock hash's, which the plain, spin and fair locks share."""
        return _scripts.LOCK_EXTEND, (self._keys.lock,), (lease_ms, hold.owner, hold.token)

    def _void_call(self, owner: str, requests: list[int]) -> Call:
        """Void the owner's acquire ``requests`` (mark them as ones that must never grant) for
        the client's resend window: by default in the meta hash (``common/void.lua``), which
        the acquire scripts read."""
        window = self._services.resend_window_ms
        return (_scripts.VOID, (self._keys.meta,), (owner, window, *requests))

    def _waiting(self, owner: str) -> Waiting:
        """How one waiting call of ``owner`` parks and is woken (:mod:`aiolock._core.waiting`)."""
        raise NotImplementedError

    def _late_args(self, owner: str) -> tuple[str, ...]:
        """The optional ARGV of an acquire of a kind whose hold counts per owner (every lock
        kind): the owner's releases of this lock that its client resent lately, whose late
        copies the hold must refuse (``late:<ids>``, see ``common/_requests.lua``); none on
        the fault-free path.  A semaphore's permit id is an owner of one acquisition, which
        no later acquire re-enters: its attempts carry none."""
        late = self._services.holds.late_releases(self._keys.lock, owner)
        return (f"late:{','.join(map(str, late))}",) if late else ()

    def _channels(self) -> tuple[str, ...]:
        """Where the client wakes one of its own waiters when a hold ends unpublished."""
        return ()

    def _withdraw_call(self, owner: str) -> Call | None:
        """What a waiter that gives up sends, if its kind keeps waiters on the server."""
        return None

    def _accept(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: MessageGrant,
    ) -> Hold | None:
        """Record a grant a message brought the waiting ``owner`` (the fair lock's hand-off),
        if it can be counted on: the hold, or ``None`` to try instead."""
        return None

    def _gave_up(self, owner: str) -> None:
        """A waiting call left without the lock (timeout, cancellation, error).

        A kind that keeps its waiters on the server (a queue) has them withdraw at once.  That
        is idempotent, so it is sent for every call that leaves without the lock, also one
        cancelled while its try (which may have queued it) was in flight: settled after that
        try, like the rest of the owner's pending work.
        """
        call = self._withdraw_call(owner)
        if call is not None:
            self._services.holds.defer(self._keys.lock, owner, self._withdraw(call, owner))

    def _withdraw_lost(self, owner: str) -> None:
        """A withdraw of ``owner`` never landed: its entry may stay on the server a while."""

    async def _withdraw(self, call: Call, owner: str) -> None:
        """Send a withdraw (idempotent) until it lands, the waiter's entry surely ended
        (``fair_wait_timeout`` after its last try), or the client closed: until then the entry
        holds others back.  Sent also while the client closes: closing waits for it (see
        Client.aclose)."""
        services = self._services
        give_up = asyncio.get_running_loop().time() + services.fair_wait_timeout
        try:
            await until_it_lands(lambda: services.calls.run(*call), give_up, services)
        except (RedisError, OSError) as exc:
            logger.warning("could not withdraw a waiter of %r: %r", self.name, exc)
            self._withdraw_lost(owner)

    # -- acquiring ---------------------------------------------------------------------------

    @teaching
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

    @teaching
    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Acquire the lock, waiting as long as it takes: ``await lock.lock()``.

        The arguments are checked at the call; the coroutine it returns does the waiting.
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
        when the client traces and a tracer provider may record (``granted(result)``: whether
        it holds the lock); else ``work`` itself, at no cost."""

        def holds_of(result: _T) -> tuple[Hold, ...]:
            if not granted(result):
                return ()
            hold = self._services.holds.get(self._hold_key, self._owner()[0])
            return () if hold is None else (hold,)

        return traced(self._services.tracing, work, self.kind, self.name, holds_of)

    def _transaction(self, holding: Holding[int]) -> TransactionContext:
        assert isinstance(holding, Hold)
        services = self._services
        if services.closed:
            raise RuntimeError("the aiolock client is closed")
        return TransactionContext(
            ready=services.check_open,  # entered on the client's loop (made anywhere: no I/O)
            name=self.name,
            hold=holding,
            check=self._transact_call(holding),
            calls=services.calls,
            holds=services.holds,
            table=services.command_table(),
            cluster=services.cluster,
        )

    async def _extend(self, holding: Holding[int], lease: float) -> None:
        assert isinstance(holding, Hold)
        if holding.watchdog:
            raise ValueError(
                f"{self.kind} {self.name!r} was acquired with lease=None: the watchdog renews "
                "it, so it has no lease to extend (acquire it with lease=<seconds> to extend it)"
            )
        if holding.lost or holding.ended:
            raise LockLostError(
                f"{self.kind} {self.name!r} (token {holding.token}) cannot be extended: it is no "
                f"longer held ({holding.lost_reason or 'released'})"
            )
        services = self._services.check_open()
        sent = asyncio.get_running_loop().time()
        # Until the reply the server has the old lease or the new one, so the client counts on
        # the shorter (never longer than the server has it): a cancelled extend leaves that.
        services.holds.cap(holding, sent + lease - CLOCK_MARGIN)
        # In flight, its reply decides whether the lease ran out meanwhile, not the timer: a
        # hold the server extends must not be counted lost (and left there with no holder).
        with services.holds.answering(holding):
            reply = await services.calls.run(*self._extend_call(holding, round(lease * 1000)))
        if int(reply) and holding.marked_lost:
            # Extended on the server, lost here all the same (forced by this client as the
            # call flew): nobody counts on it, so it goes back.
            services.holds.defer(self._keys.lock, holding.owner, self._drop(holding.owner))
        if not int(reply) or holding.marked_lost:
            if not holding.ended:  # (a release that ran meanwhile ended it: no loss)
                services.holds.lose(holding, "it was no longer held when extend() asked the server")
            raise LockLostError(
                f"{self.kind} {self.name!r} (token {holding.token}) was lost before extend(): "
                f"{holding.lost_reason or 'released meanwhile'}"
            )
        services.holds.relet(holding, sent, lease)

    async def _drop(self, owner: str) -> None:
        """Release every hold of ``owner`` on the server: one the client no longer counts on."""
        await self._settlement().drop_all(owner)

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
        owner, _ = self._owner()
        if await self._release(owner) is None:
            what = f"lock {self.name!r}"
            if self._held_by_another_task(owner):
                raise LockNotOwnedError(held_by_another_task(what))
            raise LockNotOwnedError(f"{what} is not held by this owner")

    def _held_by_another_task(self, owner: str) -> bool:
        """Whether ``owner``, a task that holds nothing, called where another owner of this
        client holds the lock (no I/O: the client's record of its holds), as a task does that
        releases a lock another task of the client took."""
        if self._explicit_owner is not None:
            return False
        return any(hold.owner != owner for hold in self._services.holds.by_key(self._hold_key))

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
        services = self._services.check_open()
        owner, task = services.owners.current(self._explicit_owner)
        return services.holds.alias(self._hold_key, owner), task

    def _try_until(
        self, wait: float, lease: float | None, who: Who | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Acquire within ``wait`` seconds: ``True`` once held, ``False`` when it ran out.

        ``wait=0`` is one attempt, however long that call takes.  Any other ``wait`` bounds the
        whole acquire, calls in flight included (a stalled server or a frozen connection cannot
        hold the caller past it): a grant that arrives after the deadline is undone in the
        background, as for a cancelled caller.  ``who``: an owner the caller names (a
        semaphore's permit), instead of the calling owner.

        A plain function that returns the coroutine, so a waiting task carries no frame of it.
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
        explicit = who is None and self._explicit_owner is not None
        if explicit:
            self._state.join(owner, waiting)
        granted = False
        try:
            pause = waiting.first_pause()
            while True:
                if pause is None:
                    # The strategy may bound the tries in flight: a call waiting for its turn
                    # costs a future here, no frames of a call (thousands arrive at once).
                    turn = waiting.turn()
                    if turn is not None:
                        try:
                            await turn
                        except asyncio.CancelledError:
                            if turn.done() and not turn.cancelled():
                                waiting.tried()  # given the turn as it was cancelled: pass it on
                            raise
                        # Let go of the spent future: this frame lives for the whole wait.
                        del turn
                    try:
                        outcome = await self._try_acquire(owner, task, lease, started)
                    finally:
                        waiting.tried()
                    if isinstance(outcome, Hold):
                        granted = True
                        waiting.held(outcome.expires_at)
                        return
                    pause = outcome
                waiter = waiting.park(pause)
                pause = None
                try:
                    await waiter
                except asyncio.CancelledError:
                    # A grant a message brought meanwhile is left untaken: the withdraw that
                    # leaving without the lock sends takes it back (see _gave_up).
                    waiting.unpark(waiter)
                    raise
                grant = waiting.woken()
                if grant is not None:
                    granted = self._accept(owner, task, lease, started, grant) is not None
                    if granted:
                        return
        finally:
            self._left(owner, waiting, granted=granted, explicit=explicit)

    def _left(self, owner: str, waiting: Waiting, *, granted: bool, explicit: bool) -> None:
        """A call of ``owner`` leaves the wait loop (``explicit``: its owner is explicit, and
        may have other calls waiting)."""
        try:
            # First: its withdraw may need the waiting's record.  The owner's place on the
            # server is also its other waiting calls' (one owner): they keep it.
            if not granted and not (explicit and self._state.others_wait(owner)):
                self._gave_up(owner)
        finally:
            waiting.leave(granted)
            if explicit:
                self._state.leave(owner, waiting, granted=granted)

    # -- one attempt: send, reconcile, record ------------------------------------------------

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
        """:meth:`_try_acquire`'s one call: send it, reconcile a grant with what the client
        knows (:meth:`Settlement.reconcile`), record it.  ``None``: it re-entered a stale
        hold, try again."""
        services = self._services
        loop = asyncio.get_running_loop()
        lease_s = services.watchdog_timeout if lease is None else lease
        attempt = Attempt(owner, services.owners.next_request(), lease_s, loop.time())
        reply, synced = await self._send(attempt)
        grant = self._grant_of(reply, attempt.lease_ms)
        if grant is None:
            return self._busy(attempt, reply)
        reconciled = await self._settlement().reconcile(attempt, grant, synced)
        if reconciled is None:
            return None
        hold = self._record(attempt, reconciled, task, started, watchdog=lease is None)
        if hold.count == 1 and hold.expires_at <= loop.time():
            # Granted past its lease by this client's clock (the request waited on a frozen
            # path): the caller gets it lost, and the server, which may hold it for a whole
            # lease from when it ran the call, gets it back now.
            self._settlement().give_back(attempt)
        return hold

    async def _send(self, attempt: Attempt) -> tuple[Any, int]:
        """Send one acquire call: its reply, and how many replicas confirmed it (with
        ``sync_replicas``).  A grant its caller never sees is undone in the background."""
        services = self._services
        call = self._attempt(attempt.owner, attempt.request, attempt.lease_ms)
        return await services.calls.run_synced(
            *call,
            sync=services.sync,
            orphan=lambda work: self._settlement().acquire_unknown(attempt, work),
            on_send=attempt.sending,
            mark_resends=services.resend_window_ms,
        )

    def _grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        """The grant an acquire's ``reply`` answers, as ``[token, count, pttl]`` (``lease_ms``:
        the lease the call asked); ``None``: it was refused (:meth:`_busy` reads that reply)."""
        return reply if isinstance(reply, list) else None

    def _busy(self, attempt: Attempt, reply: Any) -> float:
        """A refused attempt: the seconds to wait before the next (``inf``: no bound).

        A resend that was refused voided its request itself: its first copy may still arrive,
        and must not grant once the lock is free.
        """
        pttl = int(reply)
        counters = self._counters
        counters.refused_sent_at = max(counters.refused_sent_at, attempt.sent_at)
        return math.inf if pttl < 0 else pttl / 1000

    def _record(
        self,
        attempt: Attempt,
        reply: list[Any],
        task: asyncio.Task[Any] | None,
        started: float,
        *,
        watchdog: bool,
    ) -> Hold:
        """Register a grant with the client (and its watchdog, for a ``lease=None`` hold)."""
        services = self._services
        hold = services.holds.record_grant(
            name=self.name,
            kind=self.kind,
            key=self._hold_key,
            owner=attempt.owner,
            reply=reply,
            sent_at=attempt.sent_at,
            started=started,
            watchdog=watchdog,
            counters=self._counters,
            task=task,
            renew=self._renew,
            renew_keys=self._renew_keys(),
            channels=self._channels(),
        )
        if attempt.resent:
            if not hold.resent:
                hold.listeners.append(lambda: self._settlement().void_lost(hold))
            hold.resent.append(
                attempt.request
            )  # its first copy may still arrive, after the release
        if hold.watchdog:
            services.watchdog.start()
        if task is not None and self._ends_with_task and hold.count == 1:
            services.holds.tie(hold, self._release_ended)
        return hold

    async def _release_ended(self, hold: Hold) -> None:
        """Release every hold of ``hold``'s owner, whose task ended holding it (see
        :meth:`Holds.tie`); if that fails the lease ends it."""
        try:
            while await self._release(hold.owner):
                pass
        except (RedisError, OSError) as exc:
            self._services.holds.forget(hold)
            logger.warning(
                "could not release %r, held by a task that ended; its lease ends it: %r",
                self.name,
                exc,
            )

    # -- one release -------------------------------------------------------------------------

    async def _release(self, owner: str) -> int | None:
        """Release one hold: the holds left, or ``None`` if the owner held none.

        The release completes even if the caller is cancelled or the reply is lost.
        """
        services = self._services
        key = self._hold_key
        request = services.owners.next_request()
        settlement = self._settlement()
        copies = Copies()  # on_send of the call: whether it was resent

        def unknown(work: asyncio.Future[Any]) -> None:
            settlement.release_unknown(owner, request, work, copies)

        try:
            await services.holds.settle(self._keys.lock, owner)
            hold = services.holds.get(key, owner)
            believed = None if hold is None else hold.count - 1
            plain = None
            if hold is not None and believed == 0 and not self._late_args(owner):
                plain = self._plain_release(hold)  # hold.resent: None
            if hold is not None and believed == 0 and hold.resent:
                # In the background, like a settlement: a cancellation of this call must not
                # lose it (the release is then settled after it).
                voided, hold.resent = hold.resent, []
                services.holds.defer(self._keys.lock, owner, settlement.void(owner, voided))
                await services.holds.settle(self._keys.lock, owner)
        except asyncio.CancelledError:
            unknown(not_sent())
            raise
        # While it is in flight, a renewal of this hold may be answered "not held" because of
        # it: the watchdog leaves the verdict to this reply (Holds.in_release).
        sent = asyncio.get_running_loop().time()
        with services.holds.releasing(key, owner):
            if plain is not None:
                reply = await self._release_plainly(plain, owner, request, copies)
            else:
                reply = await services.calls.run(
                    *self._release_call(owner, request, None),
                    orphan=unknown,
                    on_send=copies.sending,
                )
        settlement.released_copies(owner, request, copies)
        remaining = holds_left(reply)
        # No marker outlives the lock, so a resend of the release that deleted it finds it
        # gone.  The owner's critical section ended before it sent the release, and its lease
        # had not run out as the client counts: only a force_unlock (which reports itself to
        # its own caller) or a server that lost the hold in between would have made it a loss.
        # The resend usually follows a restart: the server is asked, after the hold is no
        # longer tracked (a renewal or a new hold of the owner must not meet it meanwhile).
        doubted = (
            remaining is None
            and copies.resent
            and believed == 0
            and hold is not None
            and sent < hold.expires_at
        )
        services.holds.released(key, owner, 0 if doubted else remaining)
        settlement.check_count(owner, believed, remaining)
        if doubted and hold is not None:
            kept = False
            try:
                kept = await self._server_kept(hold)
            finally:  # a cancellation of that question leaves it a loss, recorded all the same
                if not kept:
                    services.holds.lose(hold, "the server restarted or changed since it held it")
            remaining = 0 if kept else None
        if remaining == 0:
            self._released_last(hold)
        return remaining

    async def _server_kept(self, hold: Hold) -> bool:
        """Whether the server that answers for the lock now has been up since ``hold`` was
        last confirmed on it (so it may not have lost it since); ``False`` when it cannot tell.

        Asked only after a resend.  The server counts ``uptime_in_seconds`` between two
        whole-second clock readings: it started before now less ``uptime - 1`` seconds.
        """
        try:
            info = await self._services.calls.command(self._keys.lock, ("INFO", "server"))
        except RedisError:
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        for line in text.splitlines():
            if line.startswith("uptime_in_seconds:"):
                uptime = int(line.partition(":")[2]) - 1
                return asyncio.get_running_loop().time() - uptime < hold.confirmed_at
        return False

    async def _release_plainly(
        self, command: tuple[Any, ...], owner: str, request: int, copies: Copies
    ) -> int | None:
        """Send ``command`` (see :meth:`_plain_release`): a release script's reply, 0 when it
        ended the hold, ``None`` when the owner held nothing.

        It removes the owner's fields and ``:w``, so it answers 3 or more when the hold was
        there, 1 or 0 when it was not (one other owner's ``:w``, at most: no other field is
        named by this owner then).  An answer other than 0 or 3 may mean a waiter was refused
        (``:w``): the client publishes the wake-up the script would have.  A copy of it that
        may arrive late (it was resent, or its outcome is unknown) would end the owner's next
        hold, which goes by another id for the resend window (:meth:`Holds.alias`).
        """
        services = self._services
        settlement = self._settlement()
        window = services.resend_window_ms / 1000

        def unknown(work: asyncio.Future[Any]) -> None:
            services.holds.realias(self._hold_key, owner, request, window)
            settlement.release_unknown(owner, request, self._plain_outcome(work, owner), copies)

        if isinstance(command[0], Script):  # a kind's own script (the fair lock's hand-off)
            sent = services.calls.run(*command, orphan=unknown, on_send=copies.sending)
        else:
            sent = services.calls.command(
                self._keys.lock, command, orphan=unknown, on_send=copies.sending
            )
        removed = int(await sent)
        if copies.resent:
            services.holds.realias(self._hold_key, owner, request, window)
        if removed not in (0, 3):
            # In the background: the owner's next call on the lock waits for it.
            services.holds.defer(self._keys.lock, owner, self._wake_others())
        return 0 if removed >= 3 else None

    def _plain_outcome(self, work: asyncio.Future[Any], owner: str) -> asyncio.Future[Any]:
        """The outcome of a plain release whose caller never saw it, as its script's reply
        (and the wake-up it owes, sent once known)."""
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def done(work: asyncio.Future[Any]) -> None:
            if work.cancelled():
                outcome.cancel()
            elif (error := work.exception()) is not None:
                outcome.set_exception(error)
            else:
                removed = int(work.result())
                if removed not in (0, 3):
                    self._services.holds.defer(self._keys.lock, owner, self._wake_others())
                outcome.set_result(0 if removed >= 3 else None)

        work.add_done_callback(done)
        return outcome

    async def _wake_others(self) -> None:
        """Publish the release that a plain command could not (see :meth:`_release_plainly`)."""
        for channel in self._channels():
            try:
                await self._services.calls.publish(channel, "released")
            except RedisError as exc:  # the waiters' own pause bounds their wait
                logger.warning("could not publish a release of %r: %r", self.name, exc)

    def _released_last(self, hold: Hold | None) -> None:
        """A release of this client deleted the lock (``hold``: the client's record of it, if
        it had one).

        A kind whose release publishes only if the server refused a waiter since the grant
        wakes this client's own parked waiters here: they may have been refused by an earlier
        incarnation of the lock.  A try of this client refused after the grant was read was
        refused by this incarnation: the release published, and this client hears it like any
        other (no second wake-up).
        """
        counters = self._counters
        if (
            self._publishes_if_refused
            and counters.waiters
            and (hold is None or counters.refused_sent_at <= hold.granted_at)
        ):
            self._services.pubsub.wake(self._keys.channel)

    def _settlement(self) -> Settlement:
        """The settlement of this lock's calls whose outcome is unknown (made when needed: it
        is two small objects, and most calls have nothing to settle)."""
        return Seam(self).settlement


class LockKind(HoldKind):
    """A kind whose holds can be ended whoever holds them: every lock kind (a semaphore has
    no ``force_unlock``, so its permits are a plain :class:`HoldKind`)."""

    __slots__ = ()

    def _force_call(self) -> Call:
        """Delete the lock whoever holds it, and wake who may now get in."""
        raise NotImplementedError

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; ``True`` if it existed."""
        services = self._services.check_open()
        deleted = await services.calls.run(*self._force_call())
        if deleted:
            services.holds.lose_all(self._hold_key, "it was force-unlocked")
        return bool(deleted)


class Seam:
    """All that code outside a lock kind may ask of one lock object: the declared interface.

    The composites (``MultiLock``, ``RedLock``), the semaphore's permits, the read-write lock's
    modes, the settlement of unknown outcomes, the command line and the tests go through it,
    never through the kind's underscore names, so a kind can change inside without reading
    all of them.  It is internal: the
    public calls are the lock's own.
    """

    __slots__ = ("lock",)

    def __init__(self, lock: HoldKind) -> None:
        self.lock = lock

    @property
    def name(self) -> str:
        return self.lock.name

    @property
    def kind(self) -> str:
        return self.lock.kind

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
    def explicit_owner(self) -> str | None:
        """The owner the lock was made for (``owner=``); ``None``: each calling task's own."""
        return self.lock._explicit_owner

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

    def held_by_another_task(self, owner: str) -> bool:
        """Whether ``owner``, the calling task, holds nothing of the lock while another owner of
        the same client does (no I/O)."""
        return self.lock._held_by_another_task(owner)

    def release(self, owner: str) -> Coroutine[Any, Any, int | None]:
        """Release one hold of ``owner``: the holds left, ``None`` if it held none."""
        return self.lock._release(owner)

    def drop_all(self, owner: str) -> Coroutine[Any, Any, bool]:
        """Release every hold of ``owner`` on the server; ``True`` once none is left."""
        return self.settlement.drop_all(owner)

    def read(self, what: str, *args: str) -> Coroutine[Any, Any, Any]:
        """One read of the lock's key (``common/read.lua``: exists, hget, pttl...)."""
        return self.lock._read(what, *args)

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        """The call one attempt of ``owner`` sends, as request ``request`` with a lease of
        ``lease_ms``: its script answers a grant or the PTTL to wait (read it with
        :meth:`grant_of`)."""
        return self.lock._attempt(owner, request, lease_ms)

    def withdraw_call(self, owner: str) -> Call | None:
        """The call a waiter of ``owner`` that gives up sends, if the kind keeps its waiters on
        the server (the fair queue, the waiting writers)."""
        return self.lock._withdraw_call(owner)

    # What settlement asks (see :class:`aiolock._core.settlement.Settled`).

    @property
    def settlement(self) -> Settlement:
        """The settlement of the lock's calls whose outcome is unknown."""
        return Settlement(self)

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        """The kind's release of one hold; with ``undo``, only if that acquire was applied."""
        return self.lock._release_call(owner, request, undo)

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        """The grant an acquire call's ``reply`` answers, as ``[token, count, pttl]``
        (``lease_ms``: the lease the call asked); ``None``: the lock was refused."""
        return self.lock._grant_of(reply, lease_ms)

    def void_call(self, owner: str, requests: list[int]) -> Call:
        """The kind's call that voids the owner's acquire ``requests``."""
        return self.lock._void_call(owner, requests)

    def released_last(self, hold: Hold | None) -> None:
        """A release of this client deleted the lock (``hold``: its record, if it had one)."""
        self.lock._released_last(hold)

    def wake_others(self) -> Coroutine[Any, Any, None]:
        """Publish a release on the lock's channels, for the waiters of every client."""
        return self.lock._wake_others()


def release_args(owner: str, request: int, undo: int | None) -> tuple[Any, ...]:
    """ARGV of every kind's release script: owner, request, and the acquire to undo, if any."""
    return (owner, request) if undo is None else (owner, request, undo)
