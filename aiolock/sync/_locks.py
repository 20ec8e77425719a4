"""The blocking lock, its guard and its ``with`` blocks, over any async lock kind.

A :class:`Lock` wraps one async lock object (any kind, a ``MultiLock`` or a ``RedLock`` too)
and runs each of its calls on the loop thread as the calling thread.  The async object is made
from the clients' current async clients, so after a fork the same ``Lock`` is rebuilt there.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec, TypeVar

from .._core.guard import LockGuard
from .._core.habits import teaching
from .._core.holds import Hold
from .._core.names import NameTemplate
from .._core.validate import check_lease, check_wait
from ..client import Client as AsyncClient
from ..errors import LockLostError, LockNotOwnedError
from ..lock import LockStatistics, ReentrantKind
from . import _direct
from ._loop import refuse_in_loop
from ._run import run

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Guard", "GuardContext", "Lock", "TransactionContext", "locked"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class Lock:
    """A lock whose calls block: ``client.lock(name)`` and every other kind of
    :class:`aiolock.sync.Client`, and :class:`aiolock.sync.MultiLock` / ``RedLock``.

    The calls and their semantics are the async lock's (:class:`aiolock.AsyncRLock`), the
    owner being the calling thread (or ``owner=``)::

        with client.lock("orders:42").acquire(wait=5) as guard:
            guard.fencing_token
    """

    __slots__ = ("_api", "_clients", "_entered", "_made", "_make")

    def __init__(
        self,
        clients: Sequence[Client],
        make: Callable[[Sequence[AsyncClient]], Any],
        api: str,
    ) -> None:
        self._clients = tuple(clients)
        self._make = make
        self._api = api  # the async factory, named in errors
        self._made: tuple[tuple[AsyncClient, ...], Any] | None = None
        self._entered = threading.local()  # ``with lock:`` blocks of each thread
        self.target()  # the async factory checks the arguments, at once

    def target(self) -> Any:
        """The async lock object, made with the clients' current async clients."""
        made = tuple(client.engine()[0] for client in self._clients)
        cached = self._made
        if cached is None or cached[0] != made:
            cached = self._made = (made, self._make(made))
        return cached[1]

    def clients(self) -> tuple[Client, ...]:
        """The blocking clients whose locks this one takes."""
        return self._clients

    def _run(self, call: str, undo: Callable[[Any], Any] | None = None) -> Any:
        target = self.target()
        return run(self._clients, getattr(target, call), f"await lock.{call}()", undo)

    def direct(self) -> ReentrantKind | None:
        """The async lock, if the calling thread may send its first try and its release
        itself (``_direct.py``): a plain or spin lock of one client, its owner the thread."""
        if len(self._clients) != 1 or self._clients[0].line() is None:
            return None
        target = self.target()
        if not isinstance(target, ReentrantKind) or target.explicit_owner is not None:
            return None
        return target

    def loop_path(self) -> None:
        """The calling thread's next call on the lock changes it on the loop: what the
        thread took by itself is the loop's to know from now on."""
        if len(self._clients) == 1:
            target = self._made[1] if self._made is not None else None
            if isinstance(target, ReentrantKind):
                self._clients[0].taken().pop(target.registry_key, None)

    @property
    def name(self) -> str:
        return str(self.target().name)

    @property
    def hash_tag(self) -> str:
        """The Redis Cluster hash tag of the lock's keys (see
        :attr:`aiolock.AsyncRLock.hash_tag`)."""
        return str(self.target().hash_tag)

    @teaching
    def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        """Acquire the lock, waiting at most ``wait`` seconds (``None``: forever)."""
        refuse_in_loop("await lock.try_lock()")
        wait, lease = check_wait(wait), check_lease(lease)
        direct = self.direct()
        if direct is not None:
            began = time.monotonic()
            if _direct.acquire(self._clients[0], direct, lease, wait or None):
                return True
            if wait:  # what is left of it (never 0: that would be one try, unbounded)
                wait = max(wait - (time.monotonic() - began), 0.001)
        self.loop_path()
        target = self.target()

        async def undo(held: bool) -> None:
            if held:
                await target.unlock()

        if direct is None:
            result: bool = run(
                self._clients, lambda: target.try_lock(wait, lease), "await lock.try_lock()", undo
            )
            return result
        client = self._clients[0]
        with _direct.waiting(client, direct, lease, True) as entry:
            result = run(
                self._clients,
                lambda: target.try_lock(wait, lease),
                "await lock.try_lock()",
                undo,
                entry.call,
            )
        return _direct.answered(client, direct, entry) or result

    @teaching
    def lock(self, lease: float | None = None) -> None:
        """Acquire the lock, waiting as long as it takes."""
        refuse_in_loop("await lock.lock()")
        lease = check_lease(lease)
        direct = self.direct()
        if direct is not None and _direct.acquire(self._clients[0], direct, lease):
            return
        self.loop_path()
        target = self.target()

        async def undo(_: None) -> None:
            await target.unlock()

        if direct is None:
            run(self._clients, lambda: target.lock(lease), "await lock.lock()", undo)
            return
        client = self._clients[0]
        with _direct.waiting(client, direct, lease, None) as entry:
            run(self._clients, lambda: target.lock(lease), "await lock.lock()", undo, entry.call)
        _direct.answered(client, direct, entry)

    @teaching
    def acquire(
        self, wait: float | None = None, lease: float | None = None, *, cancel_on_loss: bool = False
    ) -> GuardContext:
        """A context manager that holds the lock for its block and yields a :class:`Guard`.

        :raises TypeError: for ``cancel_on_loss=True``: a thread cannot be cancelled.
        """
        if cancel_on_loss is not False:
            raise TypeError(
                "cancel_on_loss is not available in aiolock.sync: a thread cannot be cancelled; "
                "check guard.lost or guard.valid_for() in the block instead"
            )
        return GuardContext(self, check_wait(wait), check_lease(lease))

    def __enter__(self) -> Guard:
        context = GuardContext(self, None, None)
        guard = context.__enter__()
        stack: list[GuardContext] = self._entered.__dict__.setdefault("stack", [])
        stack.append(context)
        return guard

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered.stack.pop().__exit__(exc_type, exc, tb)

    @teaching
    def unlock(self) -> None:
        """Release one hold; :class:`~aiolock.LockNotOwnedError` if the thread holds none."""
        refuse_in_loop("await lock.unlock()")
        direct = self.direct()
        if direct is not None and _direct.release(self._clients[0], direct):
            return
        self.loop_path()
        self._run("unlock")

    def force_unlock(self) -> bool:
        """Delete the lock whoever holds it; ``True`` if it existed."""
        return bool(self._run("force_unlock"))

    def is_locked(self) -> bool:
        return bool(self._run("is_locked"))

    def is_held(self) -> bool:
        """``True`` if the calling thread (or ``owner=``) holds the lock."""
        return bool(self._run("is_held"))

    def hold_count(self) -> int:
        return int(self._run("hold_count"))

    def remaining_lease(self) -> float | None:
        remaining: float | None = self._run("remaining_lease")
        return remaining

    def statistics(self) -> LockStatistics:
        """This client's view of the lock (no I/O; read on the loop thread)."""
        target = self.target()

        async def read() -> LockStatistics:
            stats: LockStatistics = target.statistics()
            return stats

        return run(self._clients, read, "lock.statistics()")

    def __repr__(self) -> str:
        made = self._made
        return f"<aiolock.sync {made[1] if made is not None else self._api!r}>"


class Guard:
    """Proof of one acquisition, yielded by ``with lock.acquire(...)`` (see
    :class:`aiolock.LockGuard`): ``fencing_token``, ``lost``, ``valid_for()``,
    ``transaction()`` and ``extend(lease)``, each blocking."""

    __slots__ = ("_guard", "_make", "_token", "lock")

    def __init__(self, lock: Lock, guard: Any) -> None:
        self.lock = lock
        self._guard = guard  # the async guard, or None until made (see taken)
        self._make: Callable[[], Any] | None = None
        self._token = guard.fencing_token

    @classmethod
    def taken(cls, lock: Lock, token: int, make: Callable[[], Any]) -> Guard:
        """The guard of a hold the thread took by its own first try: its async guard is
        ``make()``, once the loop has recorded the hold (``None`` before)."""
        guard = cls.__new__(cls)
        guard.lock = lock
        guard._guard = None
        guard._make = make
        guard._token = token
        return guard

    def _async(self) -> Any:
        """The async guard (on the loop, where the hold is recorded by then)."""
        guard = self._made()
        assert guard is not None, "the loop runs a thread's posts before its calls"
        return guard

    def _made(self) -> Any:
        """The async guard, if the loop has recorded the hold (``None`` if not yet)."""
        if self._guard is None and self._make is not None:
            self._guard = self._make()
        return self._guard

    @property
    def fencing_token(self) -> Any:
        return self._token

    @property
    def lost(self) -> bool:
        """``True`` once the lease ran out or the lock was taken from the holder."""
        return bool(self._read(lambda: self._async().lost))

    def valid_for(self) -> float:
        """Seconds for which the hold is surely still valid (see
        :meth:`aiolock.LockGuard.valid_for`)."""
        return float(self._read(lambda: self._async().valid_for()))

    def extend(self, lease: float) -> None:
        """Make a hold with a fixed lease live ``lease`` seconds from now (see
        :meth:`aiolock.LockGuard.extend`)."""
        run(self.lock.clients(), lambda: self._async().extend(lease), "await guard.extend()")

    def transaction(self) -> TransactionContext[Any]:
        """A ``with`` block whose queued commands run only while this hold lasts (see
        :meth:`aiolock.LockGuard.transaction`)."""
        return TransactionContext(self.lock.clients(), lambda: self._async().transaction())

    def _read(self, read: Callable[[], T]) -> T:
        # The hold's state belongs to the loop (reading ``lost`` may run its expiry).
        async def on_loop() -> T:
            return read()

        return run(self.lock.clients(), on_loop, "the async guard")

    def __repr__(self) -> str:
        guard = self._made()
        if guard is None:  # just granted: the loop has yet to record it
            return f"<aiolock.sync <LockGuard {self.lock.name!r} token={self._token} [held]>>"
        return f"<aiolock.sync {guard!r}>"


# What a release answers a waiting ``with lock.acquire()`` with (see _line.Waiting).
_ANSWERED: Final = object()


class GuardContext:
    """The context manager behind ``lock.acquire()`` and ``with lock``.

    The first try and the release of a plain or spin lock are the thread's own when they can
    be (``_direct.py``): the exit then reports a loss as the async guard's exit does."""

    __slots__ = ("_context", "_lease", "_lock", "_taken", "_wait")

    def __init__(self, lock: Lock, wait: float | None, lease: float | None) -> None:
        self._lock = lock
        self._wait = wait
        self._lease = lease
        self._context = lock.target().acquire(wait, lease)
        # The hold the thread took by its own first try: the lock, the loop's record of it
        # (filled once the loop made it) and its token.
        self._taken: tuple[ReentrantKind, list[Hold], int] | None = None

    def __enter__(self) -> Guard:
        lock = self._lock
        refuse_in_loop("async with lock.acquire()")
        direct = lock.direct()
        if direct is not None:
            client = lock.clients()[0]
            kept: list[Hold] = []
            wait = self._wait
            began = time.monotonic()
            if _direct.acquire(client, direct, self._lease, wait or None, kept):
                token = client.taken()[direct.registry_key].token
                self._taken = (direct, kept, token)
                return Guard.taken(
                    lock, token, lambda: LockGuard(direct, kept[0]) if kept else None
                )
            if wait:  # what is left of it (never 0: that would be one try, unbounded)
                left = max(wait - (time.monotonic() - began), 0.001)
                self._context = direct.acquire(left, self._lease)
        context = self._context

        async def undo(value: Any) -> None:
            if value is _ANSWERED:  # the block's hold, which a release answered the call with
                await lock.target().unlock()
            else:
                await context.__aexit__(None, None, None)

        lock.loop_path()
        if direct is None:
            guard = run(lock.clients(), context.__aenter__, "async with lock.acquire()", undo)
            return Guard(lock, guard)
        client = lock.clients()[0]
        with _direct.waiting(client, direct, self._lease, _ANSWERED) as entry:
            guard = run(
                lock.clients(), context.__aenter__, "async with lock.acquire()", undo, entry.call
            )
        if not _direct.answered(client, direct, entry):
            return Guard(lock, guard)
        # Answered by the release that granted it: the hold is the thread's, as after its own
        # first try (the async context's guard is not used).
        assert entry.grant is not None
        kept, token = entry.kept, entry.grant.token
        self._taken = (direct, kept, token)
        return Guard.taken(lock, token, lambda: LockGuard(direct, kept[0]) if kept else None)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._taken is not None:
            taken, self._taken = self._taken, None
            self._leave_taken(*taken, exc)
            return
        context = self._context
        self._lock.loop_path()
        run(
            self._lock.clients(),
            lambda: context.__aexit__(exc_type, exc, tb),
            "async with lock.acquire()",
        )

    def _leave_taken(
        self, direct: ReentrantKind, kept: list[Hold], token: int, exc: BaseException | None
    ) -> None:
        """Leave the block of a hold the thread took by its own first try: release it (by the
        thread's own call when the hold is surely not lost yet), then report a loss as the
        async guard's exit does (:class:`~aiolock.LockLostError`, or a note on ``exc``)."""
        lock = self._lock
        client = lock.clients()[0]
        lost: str | None = None
        try:
            released = _direct.unexpired(
                client, direct, kept[0] if kept else None
            ) and _direct.release(client, direct)
        except LockNotOwnedError:  # gone at the release: the loop recorded the loss
            released = True
            lost = run(lock.clients(), _reason(kept), "async with lock.acquire()")
        if not released:
            lock.loop_path()

            async def leave() -> str | None:
                hold = kept[0]
                if not hold.lost:  # after a loss, nothing is sent (see HoldKind._exit)
                    await direct.release_one(hold.owner)
                return (hold.lost_reason or "lost") if hold.lost else None

            lost = run(lock.clients(), leave, "async with lock.acquire()")
        if lost is None:
            return
        if exc is None:
            raise LockLostError(f"lock {lock.name!r} (token {token}) was lost while held: {lost}")
        exc.add_note(f"aiolock: lock {lock.name!r} was lost while held: {lost}")


def _reason(kept: list[Hold]) -> Callable[[], Awaitable[str]]:
    """Why the hold in ``kept`` was lost, read on the loop."""

    async def read() -> str:
        return kept[0].lost_reason or "lost"

    return read


class TransactionContext(Generic[T]):
    """A ``with`` block over an async transaction (``guard.transaction()``, made on the loop
    by ``make``)."""

    __slots__ = ("_clients", "_context", "_make")

    def __init__(
        self, clients: Sequence[Client], make: Callable[[], AbstractAsyncContextManager[T]]
    ) -> None:
        self._clients = clients
        self._make = make
        self._context: AbstractAsyncContextManager[T] | None = None

    def __enter__(self) -> T:
        async def enter() -> T:
            self._context = self._make()
            return await self._context.__aenter__()

        return run(self._clients, enter, "async with guard.transaction()")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context = self._context
        assert context is not None, "__exit__ without __enter__"
        run(
            self._clients,
            lambda: context.__aexit__(exc_type, exc, tb),
            "async with guard.transaction()",
        )


def locked(
    make_lock: Callable[[str], Lock], template: NameTemplate
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The decorator behind :meth:`aiolock.sync.Client.locked` (the async one's rules)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(function):
            raise TypeError(
                f"aiolock.sync's locked() decorates plain functions, not the coroutine function "
                f"{function.__qualname__}: use aiolock.Client.locked"
            )
        signature = inspect.signature(function)
        for root, field in template.fields.items():
            if root not in signature.parameters:
                raise ValueError(
                    f"name_template {template.template!r}: {{{field}}} names no parameter of "
                    f"{function.__qualname__}{signature}"
                )

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            name = template.name(bound.arguments, function.__qualname__)
            with make_lock(name).acquire(wait=template.wait, lease=template.lease):
                return function(*args, **kwargs)

        return wrapper

    return decorate
