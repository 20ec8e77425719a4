"""``AsyncRLock``: a reentrant distributed lock, and ``LockGuard``, the proof of holding it.

The wait loop, as in Redisson's ``RedissonLock.tryLock``: try the acquire script; on failure
join the lock's channel and park until a release wakes this task or the lock's remaining lease
runs out, and repeat until the deadline.  A release published before the subscription existed
is not missed: the SUBSCRIBE's confirmation wakes one waiter too (see :mod:`aiolock._pubsub`).
A cancelled caller leaves at once, and what its call did on the server is settled in the
background (a grant is undone, a release completed): see :mod:`aiolock._calls` for how a call
in flight is finished without its caller.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio
from redis.exceptions import RedisError

from . import _scripts
from ._calls import NotSent, Orphan, not_sent
from ._holds import Hold, NameCounters
from ._keys import LockKeys
from ._validate import check_lease, check_wait
from .errors import LockLostError, LockNotOwnedError, LockTimeoutError

if TYPE_CHECKING:
    from .client import Client

__all__ = ["AsyncRLock", "LockGuard", "LockStatistics"]

logger = logging.getLogger("aiolock.lock")

# A release script reply, read in one place: holds left, or None when the caller did not hold it.
_NOT_OWNED: Final = None
_FAILURES = (RedisError, OSError)


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


class AsyncRLock:
    """A reentrant lock shared by every process that uses the same Redis and ``name``.

    Create it with :meth:`aiolock.Client.lock`; creating it does no I/O::

        lock = client.lock("orders:42")
        async with lock.acquire(wait=5) as guard:
            await save(order, fence=guard.fencing_token)

    The owner is the calling *task* (plus the client's id): the same task may acquire again, and
    each acquisition needs one release.  ``client.lock(name, owner="job-17")`` binds the object
    to an explicit owner instead, so one task may acquire and another release.

    ``lease=None`` (the default) keeps the lock alive with the client's watchdog for as long as
    the owner holds it; a number of seconds makes the lock expire that long after it was taken,
    unless it is released first.  Waiting does not poll: a waiter parks on the lock's pub/sub
    channel, and a release wakes one waiter per client.  The remaining lease bounds every wait,
    so a lost message only delays a waiter.

    Not to be confused with :class:`asyncio.Lock`: this lock lives in Redis, its leases can run
    out, and leaving a :class:`LockGuard` block after a loss raises :class:`LockLostError`.
    """

    __slots__ = ("_client", "_counters", "_explicit_owner", "_guards", "_keys", "name")

    def __init__(self, client: Client, name: str, keys: LockKeys, owner: str | None) -> None:
        self._client = client
        self.name = name
        self._keys = keys
        self._explicit_owner = owner
        self._counters: NameCounters = client._counters_for(name)
        # Guards opened by ``async with lock:``, per task, innermost last (made on first use).
        self._guards: dict[asyncio.Task[Any], list[_GuardContext]] | None = None

    # -- acquiring ---------------------------------------------------------------------------

    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        """Acquire the lock, waiting at most ``wait`` seconds (``None``: forever).

        :returns: ``True`` once held, ``False`` if ``wait`` ran out.
        """
        wait_s, lease_s = check_wait(wait), check_lease(lease)
        if wait_s is None:
            await self._wait_for_grant(lease_s)
            return True
        return await self._try_until(wait_s, lease_s)

    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Acquire the lock, waiting as long as it takes: ``await lock.lock()``.

        The arguments are checked at the call; the coroutine it returns does the waiting (a
        plain function, so that a waiting task carries one coroutine frame fewer).
        """
        return self._wait_for_grant(check_lease(lease))

    def acquire(
        self,
        wait: float | None = None,
        lease: float | None = None,
        *,
        cancel_on_loss: bool = False,
    ) -> _GuardContext:
        """An async context manager that holds the lock for its block and yields a guard.

        Raises :class:`LockTimeoutError` when ``wait`` runs out.  The block's exit releases one
        hold, also on error or cancellation.  If the lock was lost meanwhile, the exit raises
        :class:`LockLostError`; with ``cancel_on_loss=True`` the block is also cancelled at the
        moment of the loss.
        """
        wait_s, lease_s = check_wait(wait), check_lease(lease)
        if not isinstance(cancel_on_loss, bool):
            raise TypeError(f"cancel_on_loss must be a bool, not {type(cancel_on_loss).__name__}")
        return _GuardContext(self, wait_s, lease_s, cancel_on_loss)

    async def __aenter__(self) -> LockGuard:
        context = _GuardContext(self, None, None, False)
        guard = await context.__aenter__()
        if self._guards is None:
            self._guards = {}
        self._guards.setdefault(_current_task(), []).append(context)
        return guard

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task = _current_task()
        assert self._guards is not None, "__aexit__ without __aenter__"
        contexts = self._guards[task]
        context = contexts.pop()
        if not contexts:
            del self._guards[task]
        return await context.__aexit__(exc_type, exc, tb)

    # -- releasing ---------------------------------------------------------------------------

    async def unlock(self) -> None:
        """Release one hold.

        :raises LockNotOwnedError: if the calling owner does not hold the lock.
        """
        owner, _ = self._owner()
        if await self._release(owner) is _NOT_OWNED:
            raise LockNotOwnedError(f"lock {self.name!r} is not held by this owner")

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake a waiter; ``True`` if it existed."""
        client = self._client._check_open()
        keys = self._keys
        deleted = await client._calls.run(_scripts.FORCE_UNLOCK, (keys.lock, keys.channel), ())
        if deleted:
            client._holds.lose_all(keys.lock, "it was force-unlocked")
        return bool(deleted)

    # -- inspecting --------------------------------------------------------------------------

    async def is_locked(self) -> bool:
        """``True`` if anyone holds the lock."""
        return bool(await self._client._check_open()._redis.exists(self._keys.lock))

    async def is_held(self) -> bool:
        """``True`` if the calling owner holds the lock."""
        owner, _ = self._owner()
        return bool(await self._client._redis.hexists(self._keys.lock, owner))

    async def hold_count(self) -> int:
        """The calling owner's reentrant count (0 if it does not hold the lock)."""
        owner, _ = self._owner()
        count = await self._client._redis.hget(self._keys.lock, owner)
        return 0 if count is None else int(count)

    async def remaining_lease(self) -> float | None:
        """Seconds until the lock expires; ``None`` if it is not locked."""
        pttl = int(await self._client._check_open()._redis.pttl(self._keys.lock))
        if pttl == -2:
            return None
        return math.inf if pttl == -1 else pttl / 1000

    def statistics(self) -> LockStatistics:
        """A snapshot of this lock name from this client's view (no I/O)."""
        holds = self._client._holds.by_key(self._keys.lock)
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
        return f"<AsyncRLock {self.name!r}{owner} [{state}{extra}]>"

    # -- the machinery -----------------------------------------------------------------------

    def _owner(self) -> tuple[str, asyncio.Task[Any] | None]:
        client = self._client._check_open()
        if self._explicit_owner is not None:
            return client._explicit_owner_id(self._explicit_owner), None
        task = _current_task()
        return client._task_owner_id(task), task

    def _try_until(self, wait: float, lease: float | None) -> Coroutine[Any, Any, bool]:
        """Acquire within ``wait`` seconds: ``True`` once held, ``False`` when it ran out.

        ``wait=0`` is one attempt, however long that call takes.  Any other ``wait`` bounds the
        whole acquire, calls in flight included (a stalled server or a frozen connection cannot
        hold the caller past it): a grant that arrives after the deadline is undone in the
        background, as for a cancelled caller.

        A plain function that returns the coroutine: one frame fewer for every waiting task.
        """
        if wait == 0:
            return self._try_once(lease)
        deadline = asyncio.get_running_loop().time() + wait
        return self._wait_for_grant_until(lease, deadline)

    async def _try_once(self, lease: float | None) -> bool:
        owner, task = self._owner()
        await self._client._holds.settle(self._keys.lock, owner)
        return isinstance(await self._try_acquire(owner, task, lease), Hold)

    async def _wait_for_grant_until(self, lease: float | None, deadline: float) -> bool:
        try:
            async with asyncio.timeout_at(deadline) as timeout:
                await self._wait_for_grant(lease)
                return True
        except TimeoutError:
            if timeout.expired():
                return False
            raise

    def _granted(self) -> Hold:
        """The calling owner's hold, right after an acquire returned (no await in between)."""
        owner, _ = self._owner()
        hold = self._client._holds.get(self._keys.lock, owner)
        if hold is None:  # the grant registers it: never, short of a bug
            raise RuntimeError(f"lock {self.name!r} was granted but is not registered")
        return hold

    async def _wait_for_grant(self, lease: float | None) -> None:
        """The wait loop (see the module docstring); a caller with a deadline bounds it.

        The owner is the task that runs it, not the one that made the coroutine
        (``asyncio.create_task(lock.lock())`` acquires for the new task).
        """
        owner, task = self._owner()
        client = self._client
        loop = asyncio.get_running_loop()
        channel = self._keys.channel
        await client._holds.settle(self._keys.lock, owner)
        counters = self._counters
        # FIFO within this client: while some of its tasks are already after the lock (trying or
        # parked), a newcomer (a task that has just released it, say) queues behind them instead
        # of barging in; those that leave without the lock wake the next in line.  An owner that
        # already holds the lock re-enters at once: it must not queue behind its own waiters.
        queue_first = counters.contenders > 0 and client._holds.get(self._keys.lock, owner) is None
        counters.contenders += 1
        granted = False
        try:
            # Seconds to park before the next try (inf: the lock has no expiry), or None: try
            # now.  A queued task parks at the back until the tasks ahead hand on (with no TTL
            # to go by, at most one watchdog lease); one that has tried parks at the front.
            pause: float | None = client.watchdog_timeout
            if not queue_first:
                outcome = await self._try_acquire(owner, task, lease)
                if isinstance(outcome, Hold):
                    granted = True
                    return
                pause = outcome
            # A release published during the first try, or the confirmation of a subscription
            # made meanwhile, left a permit for this task (see Entry): no try needed before.
            entry = client._pubsub.join(channel, counters)
            counters.waiters += 1
            try:
                front = not queue_first
                while True:
                    if pause is None:
                        outcome = await self._try_acquire(owner, task, lease)
                        if isinstance(outcome, Hold):
                            granted = True
                            return
                        pause = outcome
                    # A bare future in the entry's queue: no coroutine frame or timeout context
                    # per parked task.
                    waiter = entry.park(loop.time() + pause, front=front)
                    pause, front = None, True
                    try:
                        await waiter
                    except asyncio.CancelledError:
                        entry.unpark(waiter)
                        raise
                    entry.raise_refusal()  # the server refused the channel: waiting is futile
                    client._check_open()  # woken because the client closes: no more tries
            finally:
                client._pubsub.release(entry)
                counters.waiters -= 1
        finally:
            counters.contenders -= 1
            client._pubsub.left(channel, granted=granted)

    async def _try_acquire(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None
    ) -> Hold | float:
        """One run of the acquire script: the hold, or seconds until the lock expires."""
        client = self._client
        keys = self._keys
        lease_ms = round((client.watchdog_timeout if lease is None else lease) * 1000)
        request = client._next_request()
        sent_at = asyncio.get_running_loop().time()

        def orphan(work: asyncio.Future[Any]) -> None:
            # A grant that the caller will never see is undone, exactly that one.
            self._settle_later(
                owner, work, lambda: self._undo_if_granted(work, owner, request, lease_ms / 1000)
            )

        reply = await client._calls.run(
            _scripts.ACQUIRE, (keys.lock, keys.meta), (lease_ms, owner, request), orphan=orphan
        )
        if isinstance(reply, list):
            hold = client._holds.granted(
                name=self.name,
                key=keys.lock,
                owner=owner,
                reply=reply,
                sent_at=sent_at,
                watchdog=lease is None,
                counters=self._counters,
                task=task,
            )
            if hold.watchdog:
                client._watchdog.start()
            return hold
        pttl = int(reply)
        return math.inf if pttl < 0 else pttl / 1000

    async def _release(self, owner: str) -> int | None:
        """Release one hold; the release completes even if the caller is cancelled."""
        client = self._client
        holds = client._holds
        key = self._keys.lock
        request = client._next_request()

        def orphan(work: asyncio.Future[Any]) -> None:
            self._settle_later(owner, work, lambda: self._release_outcome(work, owner, request))

        try:
            await holds.settle(key, owner)
        except asyncio.CancelledError:
            orphan(not_sent())
            raise
        try:
            remaining = await self._run_release(owner, request, orphan=orphan)
        except _FAILURES:
            # The outcome is unknown.  Do not keep a hold that may be gone: the watchdog would
            # renew it and the next acquire would silently re-enter it.  The same request is
            # idempotent, so finish it in the background; the owner's next call waits for it.
            horizon = self._untrack_one(owner)
            holds.defer(key, owner, self._retry_release(owner, request, None, horizon))
            raise
        holds.released(key, owner, remaining)
        return remaining

    async def _release_outcome(self, work: asyncio.Future[Any], owner: str, request: int) -> None:
        """Settle a release whose caller was cancelled: record it, or resend it until it lands."""
        if work.exception() is None:
            self._client._holds.released(self._keys.lock, owner, _remaining(work.result()))
            return
        horizon = self._untrack_one(owner)
        await self._retry_release(owner, request, None, horizon)

    def _settle_later(
        self,
        owner: str,
        work: asyncio.Future[Any],
        settle: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        """Once the orphaned call ``work`` is over, ``settle()`` what it did on the server.

        Registered at once, so the owner's next call on this lock waits for both.
        """

        async def when_done() -> None:
            await asyncio.wait([work])
            if not work.cancelled():  # cancelled: the client is closing
                await settle()

        self._client._holds.defer(self._keys.lock, owner, when_done())

    def _untrack_one(self, owner: str) -> float:
        """Stop counting one hold whose release has an unknown outcome; how long to resend it."""
        holds = self._client._holds
        hold = holds.get(self._keys.lock, owner)
        horizon = self._client.watchdog_timeout
        if hold is not None:
            horizon = max(horizon, hold.expires_at - asyncio.get_running_loop().time())
            if hold.count > 1:
                hold.count -= 1
            else:
                holds.forget(hold)
        return horizon

    async def _run_release(
        self,
        owner: str,
        request: int,
        undo: int | None = None,
        *,
        orphan: Orphan | None = None,
    ) -> int | None:
        keys = self._keys
        args: tuple[Any, ...] = (owner, request) if undo is None else (owner, request, undo)
        reply = await self._client._calls.run(
            _scripts.RELEASE, (keys.lock, keys.meta, keys.channel), args, orphan=orphan
        )
        return _remaining(reply)

    async def _undo_if_granted(
        self, work: asyncio.Future[Any], owner: str, acquire_request: int, horizon: float
    ) -> None:
        failure = work.exception()
        if isinstance(failure, NotSent):
            return
        if failure is None and not isinstance(work.result(), list):
            return  # the lock was busy: nothing was granted
        # Granted, or failed with an unknown outcome: undo exactly that request, if it landed.
        request = self._client._next_request()
        await self._retry_release(owner, request, acquire_request, horizon)

    async def _retry_release(
        self, owner: str, request: int, undo: int | None, horizon: float
    ) -> None:
        """Send one (idempotent) release until it lands, the lease surely ran out, or close."""
        client = self._client
        loop = asyncio.get_running_loop()
        give_up = loop.time() + horizon
        delay = 0.02
        while True:
            try:
                remaining = await self._run_release(owner, request, undo)
            except _FAILURES as exc:
                if client.closed or loop.time() + delay > give_up:
                    logger.warning("gave up releasing %r in the background: %r", self.name, exc)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            client._holds.released(self._keys.lock, owner, remaining)
            return


class LockGuard:
    """Proof of one acquisition, yielded by :meth:`AsyncRLock.acquire`.

    :ivar fencing_token: strictly increases with every fresh (non-reentrant) acquisition of the
        lock's name, across all clients; pass it to the storage you protect so that it can
        reject a writer that lost the lock.  A reentrant acquisition shares its holder's token.
    :ivar lost: ``True`` once the lease ran out or the lock was taken from the holder.
    """

    __slots__ = ("_hold", "lock")

    def __init__(self, lock: AsyncRLock, hold: Hold) -> None:
        self.lock = lock
        self._hold = hold

    @property
    def fencing_token(self) -> int:
        return self._hold.token

    @property
    def lost(self) -> bool:
        return self._hold.lost

    def __repr__(self) -> str:
        hold = self._hold
        state = "lost" if hold.lost else "held"
        return f"<LockGuard {self.lock.name!r} token={hold.token} [{state}]>"


class _GuardContext:
    """The async context manager behind ``lock.acquire()`` and ``async with lock``."""

    __slots__ = ("_cancel_on_loss", "_guard", "_lease", "_lock", "_scope", "_wait")

    def __init__(
        self, lock: AsyncRLock, wait: float | None, lease: float | None, cancel_on_loss: bool
    ) -> None:
        self._lock = lock
        self._wait = wait
        self._lease = lease
        self._cancel_on_loss = cancel_on_loss
        self._guard: LockGuard | None = None
        self._scope: anyio.CancelScope | None = None

    async def __aenter__(self) -> LockGuard:
        if self._guard is not None:
            raise RuntimeError("this acquire() context is already in use")
        lock = self._lock
        if self._wait is None:
            await lock._wait_for_grant(self._lease)
        elif not await lock._try_until(self._wait, self._lease):
            raise LockTimeoutError(f"could not acquire lock {lock.name!r} within {self._wait}s")
        hold = lock._granted()
        self._guard = LockGuard(lock, hold)
        if self._cancel_on_loss:
            # Entered here and exited in __aexit__, in the same task, around the block.
            self._scope = scope = anyio.CancelScope()
            scope.__enter__()
            hold.listeners.append(scope.cancel)
            if hold.lost:
                scope.cancel()
        return self._guard

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        guard = self._guard
        assert guard is not None, "__aexit__ without __aenter__"
        hold = guard._hold
        cancelled_by_loss = False
        if self._scope is not None:
            hold.listeners.remove(self._scope.cancel)
            cancelled_by_loss = bool(self._scope.__exit__(exc_type, exc, tb))
        self._guard = None
        if not hold.lost:
            # The release must not touch a lock somebody else now holds: after a loss we do not
            # send it at all (an explicit owner may have been granted the lock again).
            await self._lock._release(hold.owner)
        if not hold.lost:
            return False
        if exc is None or cancelled_by_loss:
            raise LockLostError(
                f"lock {self._lock.name!r} (token {hold.token}) was lost while held: "
                f"{hold.lost_reason}"
            ) from exc
        exc.add_note(f"aiolock: lock {self._lock.name!r} was lost while held: {hold.lost_reason}")
        return False


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock must be used from inside an asyncio task")
    return task


def _remaining(reply: Any) -> int | None:
    """A release script reply: holds left, or ``None`` when the owner did not hold the lock."""
    return None if reply is None else int(reply)
