"""The blocking read-write lock, semaphore and countdown latch (the async kinds' calls)."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from .._core.habits import teaching
from .._core.validate import check_lease, check_name, check_permits, check_wait
from ..lock import LockStatistics
from ._locks import Lock, TransactionContext
from ._run import run

if TYPE_CHECKING:
    from ..latch import AsyncCountDownLatch
    from ..semaphore import AsyncSemaphore
    from ._client import Client

__all__ = ["CountDownLatch", "Permit", "ReadWriteLock", "Semaphore"]


class ReadWriteLock:
    """A read-write lock (see :class:`aiolock.AsyncReadWriteLock`), its calls blocking."""

    __slots__ = ("_client", "name")

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = check_name(name)

    def read_lock(self, *, owner: str | None = None) -> Lock:
        """The shared mode: many owners may hold it at once."""
        name = self.name
        return Lock(
            (self._client,),
            lambda made: made[0].rw_lock(name).read_lock(owner=owner),
            "client.rw_lock(name).read_lock",
        )

    def write_lock(self, *, owner: str | None = None) -> Lock:
        """The exclusive mode."""
        name = self.name
        return Lock(
            (self._client,),
            lambda made: made[0].rw_lock(name).write_lock(owner=owner),
            "client.rw_lock(name).write_lock",
        )

    def __repr__(self) -> str:
        return f"<aiolock.sync.ReadWriteLock {self.name!r}>"


class Semaphore:
    """A semaphore with leased permits (see :class:`aiolock.AsyncSemaphore`), blocking::

    with client.semaphore("exports", 5).acquire(wait=10) as permit:
        permit.id
    """

    __slots__ = ("_client", "_made", "name", "permits")

    def __init__(self, client: Client, name: str, permits: int) -> None:
        self._client = client
        self.name = check_name(name)
        self.permits = check_permits(permits)
        self._made: tuple[Any, AsyncSemaphore] | None = None

    def target(self) -> AsyncSemaphore:
        made = self._client.engine()[0]
        if self._made is None or self._made[0] is not made:
            self._made = (made, made.semaphore(self.name, self.permits))
        return self._made[1]

    @teaching
    def acquire(self, wait: float | None = None, lease: float | None = None) -> PermitContext:
        """A context manager that holds a permit for its block (``LockTimeoutError`` when
        ``wait`` runs out; ``LockLostError`` on leaving it if the permit was lost)."""
        return PermitContext(self, check_wait(wait), check_lease(lease))

    @teaching
    def try_acquire(self, wait: float | None = 0, lease: float | None = None) -> Permit | None:
        """A permit, waiting at most ``wait`` seconds (``None``: forever), or ``None``."""
        target = self.target()

        async def undo(permit: Any) -> None:
            if permit is not None:
                await permit.release()

        permit = run(
            (self._client,),
            lambda: target.try_acquire(wait, lease),
            "await sem.try_acquire()",
            undo,
        )
        return None if permit is None else Permit(self._client, permit)

    @teaching
    def set_permits(self, permits: int) -> None:
        """Change the count for everyone (see :meth:`aiolock.AsyncSemaphore.set_permits`)."""
        permits = check_permits(permits)
        target = self.target()
        self.permits = permits  # also the count of the semaphore remade after a fork
        run((self._client,), lambda: target.set_permits(permits), "await sem.set_permits()")

    def available(self) -> int:
        """How many permits are free now."""
        target = self.target()
        return run((self._client,), target.available, "await sem.available()")

    def statistics(self) -> LockStatistics:
        target = self.target()

        async def read() -> LockStatistics:
            return target.statistics()

        return run((self._client,), read, "sem.statistics()")

    @property
    def hash_tag(self) -> str:
        return self.target().hash_tag

    def __repr__(self) -> str:
        return f"<aiolock.sync.Semaphore {self.name!r} permits={self.permits}>"


class Permit:
    """One permit of a :class:`Semaphore` (see :class:`aiolock.Permit`)."""

    __slots__ = ("_client", "_permit")

    def __init__(self, client: Client, permit: Any) -> None:
        self._client = client
        self._permit = permit

    @property
    def id(self) -> str:
        return str(self._permit.id)

    @property
    def lost(self) -> bool:
        permit = self._permit

        async def read() -> bool:
            return bool(permit.lost)

        return run((self._client,), read, "permit.lost")

    def valid_for(self) -> float:
        permit = self._permit

        async def read() -> float:
            return float(permit.valid_for())

        return run((self._client,), read, "permit.valid_for()")

    def extend(self, lease: float) -> None:
        """Make the permit live ``lease`` seconds from now (see :meth:`aiolock.Permit.extend`)."""
        permit = self._permit
        run((self._client,), lambda: permit.extend(lease), "await permit.extend()")

    def transaction(self) -> TransactionContext[Any]:
        """Commands that run only while the permit is held (see
        :meth:`aiolock.Permit.transaction`)."""
        permit = self._permit
        return TransactionContext((self._client,), permit.transaction)

    def release(self) -> None:
        """Give the permit back; ``LockNotOwnedError`` if it was no longer held."""
        run((self._client,), self._permit.release, "await permit.release()")

    def __repr__(self) -> str:
        return f"<aiolock.sync {self._permit!r}>"


class PermitContext:
    """The context manager behind :meth:`Semaphore.acquire`."""

    __slots__ = ("_client", "_context")

    def __init__(self, semaphore: Semaphore, wait: float | None, lease: float | None) -> None:
        self._client = semaphore._client
        self._context = semaphore.target().acquire(wait, lease)

    def __enter__(self) -> Permit:
        context = self._context

        async def undo(_: Any) -> None:
            await context.__aexit__(None, None, None)

        permit = run((self._client,), context.__aenter__, "async with sem.acquire()", undo)
        return Permit(self._client, permit)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        context = self._context
        run(
            (self._client,),
            lambda: context.__aexit__(exc_type, exc, tb),
            "async with sem.acquire()",
        )


class CountDownLatch:
    """A countdown latch (see :class:`aiolock.AsyncCountDownLatch`), its calls blocking."""

    __slots__ = ("_client", "_made", "name")

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = check_name(name)
        self._made: tuple[Any, AsyncCountDownLatch] | None = None

    def _target(self) -> AsyncCountDownLatch:
        made = self._client.engine()[0]
        if self._made is None or self._made[0] is not made:
            self._made = (made, made.countdown_latch(self.name))
        return self._made[1]

    def try_set_count(self, count: int) -> bool:
        """Set the count (at least 1); ``False`` if a count above 0 is set."""
        latch = self._target()
        return run(
            (self._client,), lambda: latch.try_set_count(count), "await latch.try_set_count()"
        )

    def count_down(self) -> None:
        """Count down by one; at zero every waiter of every client wakes."""
        latch = self._target()
        run((self._client,), latch.count_down, "await latch.count_down()")

    def count(self) -> int:
        latch = self._target()
        return run((self._client,), latch.count, "await latch.count()")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the count is 0: ``True`` then, ``False`` if ``timeout`` ran out first."""
        latch = self._target()
        return run((self._client,), lambda: latch.wait(timeout), "await latch.wait()")

    def __repr__(self) -> str:
        return f"<aiolock.sync.CountDownLatch {self.name!r}>"
