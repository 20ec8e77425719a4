"""``LockGuard`` and the ``async with`` machinery that every lock kind shares.

A kind (a single lock, or a composite such as ``MultiLock``) supplies two steps: ``_enter(wait,
lease)`` returns a :class:`Holding` once held (or raises :class:`LockTimeoutError`), and
``_exit(holding)`` releases it.  :class:`Guarded` turns them into ``acquire()`` and ``async
with lock:``; the guard reports losses, cancels the block on a loss when asked, and makes
leaving a block that lost its lock raise :class:`LockLostError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from ..errors import LockLostError
from .habits import not_awaitable, teaching
from .owners import current_task
from .validate import check_lease, check_timeout, check_wait

if TYPE_CHECKING:
    from .transaction import Transaction

__all__ = ["Guarded", "Holding", "LockGuard"]

TokenT_co = TypeVar("TokenT_co", covariant=True)


class Holding(Protocol[TokenT_co]):
    """What a guard needs of a hold: its token, whether it was lost, and who to tell."""

    @property
    def token(self) -> TokenT_co: ...

    @property
    def lost(self) -> bool:
        """Lost as recorded so far: no expiry run early (a read for a repr)."""
        ...

    def check_lost(self) -> bool:
        """Lost, or its lease ran out by this client's clock (recorded now, which may fire
        its listeners)."""
        ...

    @property
    def lost_reason(self) -> str | None: ...

    @property
    def listeners(self) -> list[Callable[[], object]]: ...

    def valid_for(self) -> float: ...


class LockGuard(Generic[TokenT_co]):
    """Proof of one acquisition, yielded by ``acquire()`` and ``async with lock``.

    :ivar fencing_token: strictly increases with every fresh (non-reentrant) acquisition of the
        lock's name, across all clients; pass it to the storage you protect so that it can
        reject a writer that lost the lock.  A reentrant acquisition shares its holder's token.
        A ``MultiLock``'s token is the tuple of its locks' tokens.
    :ivar lost: ``True`` once the lease ran out or the lock was taken from the holder.

    :meth:`transaction` queues Redis commands that run only while the hold lasts, and
    :meth:`valid_for` says how long it surely lasts.
    """

    __slots__ = ("_holding", "lock")

    def __init__(self, lock: Guarded[TokenT_co], holding: Holding[TokenT_co]) -> None:
        self.lock = lock
        self._holding = holding

    @property
    def fencing_token(self) -> TokenT_co:
        return self._holding.token

    @property
    def lost(self) -> bool:
        return self._holding.check_lost()

    def valid_for(self) -> float:
        """Seconds for which the hold is surely still valid, by this client's conservative
        clock (no I/O); ``0.0`` once lost or released.

        Counted from when the last grant or renewal was *sent* (the server counts its lease
        from when it ran the call, later), minus a small margin: never more than the server's
        PTTL of the hold.  With ``lease=None`` it grows at each watchdog renewal; a renewal
        that cannot reach the server lets it run down to 0.0, when the hold is taken for
        lost.  Check it before a side effect that must finish while the lock is held.  A
        ``MultiLock``'s is its shortest part's; a ``RedLock``'s, the time its quorum lasts.
        """
        return self._holding.valid_for()

    async def extend(self, lease: float) -> None:
        """Make the hold last ``lease`` seconds from now (longer or shorter than before).

        The lease is the whole lock's, whatever the reentrant count (for a read hold, this
        owner's reads).  One atomic call checks that this owner still holds the lock with this
        guard's fencing token before it sets the lease; :meth:`valid_for` follows.  As
        redis-py's ``Lock.extend(..., replace_ttl=True)`` and Redisson's ``updateLeaseTime``.

        :raises LockLostError: if the hold is already gone (its lease ran out, it was forced
            or released); the guard is then marked lost.
        :raises ValueError: for a watched hold (acquired with ``lease=None``: the watchdog
            renews it), or a ``lease`` that is not positive and finite, before any I/O.
        :raises TypeError: for a ``lease`` that is not a number, and for a ``MultiLock`` or
            ``RedLock`` guard (its parts live on several slots or servers).
        """
        await self.lock._extend(self._holding, check_timeout(lease, "lease", minimum=0.001))

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """An async context manager whose commands land only while this hold lasts::

            async with guard.transaction() as tx:
                tx.sadd(members, user)          # queued with redis-py's command methods
                tx.expire(members, 3600)
            tx.results                          # [1, True]

        On a clean exit of the block one atomic script call checks that this owner still
        holds the lock with this guard's fencing token, then runs the queued commands (as
        EXEC runs a MULTI's).  If the hold is gone (expired, forced, taken over) none runs,
        the guard is marked lost, and :class:`~aiolock.LockLostError` is raised.  An error in
        the block sends nothing.

        A command that a script may not run (MULTI, WAIT, SUBSCRIBE, EVAL, a blocking pop...)
        raises :class:`ValueError` as it is queued.  On a Cluster every key must hash to the
        lock's slot: build keys with ``lock.hash_tag``; one that does not raises
        :class:`ValueError` naming it, before anything is sent.  The call is never resent: if
        the connection fails with it written, the error propagates and the outcome is
        unknown, as for a MULTI/EXEC.

        :raises TypeError: for a ``MultiLock`` or ``RedLock`` guard (its parts live on
            several slots or servers: no one script can check them all).
        """
        return self.lock._transaction(self._holding)

    def __repr__(self) -> str:
        holding = self._holding
        state = "lost" if holding.lost else "held"
        return f"<LockGuard {self.lock.name!r} token={holding.token} [{state}]>"


class Guarded(Generic[TokenT_co]):
    """``acquire()`` and ``async with`` over a kind's ``_enter`` and ``_exit``."""

    # Guards opened by ``async with lock:``, per task, innermost last (made on first use by
    # ``__aenter__``; subclasses set it to None).
    __slots__ = ("_guards",)
    name: str
    _guards: dict[asyncio.Task[Any], list[GuardContext[TokenT_co]]] | None

    async def _enter(self, wait: float | None, lease: float | None) -> Holding[TokenT_co]:
        """Hold the lock (waiting at most ``wait``); raise ``LockTimeoutError`` when it ran out."""
        raise NotImplementedError

    async def _exit(self, holding: Holding[TokenT_co]) -> None:
        """Release what is left of the hold that ``_enter`` returned (also after a loss)."""
        raise NotImplementedError

    def _transaction(self, holding: Holding[TokenT_co]) -> AbstractAsyncContextManager[Transaction]:
        """A transaction under ``holding`` (see :meth:`LockGuard.transaction`); a kind that
        lives in one slot of one server supplies it."""
        raise TypeError(
            f"a {type(self).__name__} guard has no transaction(): its locks live on several "
            "slots or servers, which no one atomic call can check; use the transaction of "
            "one lock's guard"
        )

    async def _extend(self, holding: Holding[TokenT_co], lease: float) -> None:
        """Set the hold's lease to ``lease`` seconds from now (see :meth:`LockGuard.extend`); a
        kind that lives in one slot of one server supplies it."""
        raise TypeError(
            f"a {type(self).__name__} guard has no extend(): its locks live on several slots "
            "or servers, which no one atomic call can check; acquire it with the lease it needs"
        )

    @teaching
    def acquire(
        self,
        wait: float | None = None,
        lease: float | None = None,
        *,
        cancel_on_loss: bool = False,
    ) -> GuardContext[TokenT_co]:
        """An async context manager that holds the lock for its block and yields a guard.

        Raises :class:`~aiolock.LockTimeoutError` when ``wait`` runs out.  The block's exit
        releases one hold, also on error or cancellation.  If the lock was lost meanwhile, the
        exit raises :class:`~aiolock.LockLostError`; with ``cancel_on_loss=True`` the block is
        also cancelled at the moment of the loss.
        """
        wait_s, lease_s = check_wait(wait), check_lease(lease)
        if not isinstance(cancel_on_loss, bool):
            raise TypeError(f"cancel_on_loss must be a bool, not {type(cancel_on_loss).__name__}")
        return GuardContext(self, wait_s, lease_s, cancel_on_loss)

    async def __aenter__(self) -> LockGuard[TokenT_co]:
        context = GuardContext(self, None, None, False)
        guard = await context.__aenter__()
        if self._guards is None:
            self._guards = {}
        self._guards.setdefault(current_task(), []).append(context)
        return guard

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task = current_task()
        assert self._guards is not None, "__aexit__ without __aenter__"
        contexts = self._guards[task]
        context = contexts.pop()
        if not contexts:
            del self._guards[task]
        return await context.__aexit__(exc_type, exc, tb)


class GuardContext(Generic[TokenT_co]):
    """The async context manager behind ``lock.acquire()`` and ``async with lock``.

    With ``cancel_on_loss`` a loss cancels the block's task once, as ``asyncio.timeout()``
    does: the cancellation is requested while the task is suspended (from a loop callback, so
    it lands in the block, never in the release after it), awaits in the block's own
    ``except``/``finally`` run normally, and the exit turns that one cancellation into
    :class:`LockLostError` (a cancellation from outside still propagates).
    """

    __slots__ = (
        "_cancel_on_loss",
        "_cancelling",
        "_guard",
        "_lease",
        "_lock",
        "_loss",
        "_task",
        "_wait",
    )

    def __init__(
        self,
        lock: Guarded[TokenT_co],
        wait: float | None,
        lease: float | None,
        cancel_on_loss: bool,
    ) -> None:
        self._lock = lock
        self._wait = wait
        self._lease = lease
        self._cancel_on_loss = cancel_on_loss
        self._guard: LockGuard[TokenT_co] | None = None
        self._task: asyncio.Task[Any] | None = None  # the block's, with cancel_on_loss
        self._cancelling = 0  # the task's cancellation requests when the block began
        # None: no loss; "due": a cancellation is on its way; "sent": the task was cancelled.
        self._loss: Literal["due", "sent"] | None = None

    if not TYPE_CHECKING:  # a type checker refuses the await as it is: no awaitable to see

        def __await__(self):
            raise TypeError(
                not_awaitable(
                    f"{type(self._lock).__name__}.acquire()",
                    "use `async with lock.acquire(...) as guard:`, which releases at the end "
                    "of the block, or `await lock.lock()` / `await lock.try_lock()` and then "
                    "`await lock.unlock()`",
                )
            )

    async def __aenter__(self) -> LockGuard[TokenT_co]:
        if self._guard is not None:
            raise RuntimeError("this acquire() context is already in use")
        holding = await self._lock._enter(self._wait, self._lease)
        self._guard = LockGuard(self._lock, holding)
        if self._cancel_on_loss:
            self._task = task = current_task()
            self._cancelling = task.cancelling()
            self._loss = None
            holding.listeners.append(self._lost)
            if holding.check_lost():
                self._due()
        return self._guard

    def _lost(self) -> None:
        """The hold was lost (a listener, run by whatever noticed it).  Noticed by the block's
        own task (an extend or a transaction that raises ``LockLostError``, a read of
        ``guard.lost``), the block knows already: its cleanup is not cancelled."""
        if asyncio.current_task() is not self._task:
            self._due()

    def _due(self) -> None:
        if self._loss is None and self._task is not None:
            self._loss = "due"
            asyncio.get_running_loop().call_soon(self._cancel)

    def _cancel(self) -> None:
        task = self._task
        if self._loss == "due" and task is not None:  # else the block has ended meanwhile
            self._loss = "sent"
            task.cancel(f"aiolock: the lock {self._lock.name!r} was lost")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        guard = self._guard
        assert guard is not None, "__aexit__ without __aenter__"
        holding = guard._holding
        cancelled_by_loss = False
        task = self._task
        if task is not None:
            holding.listeners.remove(self._lost)
            self._task = None
            if self._loss == "sent":
                # Ours, unless the task was cancelled from outside too: then that propagates.
                outside = task.uncancel() > self._cancelling
                cancelled_by_loss = exc_type is asyncio.CancelledError and not outside
            self._loss = None
        self._guard = None
        await self._lock._exit(holding)
        if not holding.check_lost():
            return False
        name = self._lock.name
        if exc is None or cancelled_by_loss:
            raise LockLostError(
                f"lock {name!r} (token {holding.token}) was lost while held: {holding.lost_reason}"
            ) from exc
        exc.add_note(f"aiolock: lock {name!r} was lost while held: {holding.lost_reason}")
        return False
