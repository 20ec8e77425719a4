"""``RedLock``: one lock over several independent Redis masters, held by a majority of them.

The algorithm of the Redis documentation's "Distributed locks with Redis", on aiolock's plain
lock on each server (so every server's part is reentrant, idempotent per request, settled on
cancellation, and renewed by that client's watchdog).  An attempt asks every server at once;
it holds when a majority granted within the validity time
``lease - elapsed - (lease * 0.01 + 0.002)``; otherwise what it took is released everywhere
and it tries again after a random delay, until the wait runs out.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import RedisError

from ._core.composite import (
    CompositeHold,
    CompositeStatistics,
    release_all,
    start_releases,
)
from ._core.guard import Guarded, Holding
from ._core.habits import held_by_another_task, teaching
from ._core.holds import Hold
from ._core.metrics import traced
from ._core.validate import check_lease, check_name, check_wait
from .errors import LockNotOwnedError, LockTimeoutError
from .lock import AsyncRLock

if TYPE_CHECKING:
    from .client import Client

__all__ = ["RedLock"]

_RETRY_DELAY: Final = 0.05  # the longest random pause between two attempts, in seconds
_FAILURES: Final = (RedisError, OSError)


class RedLock(Guarded[int]):
    """A lock held by a majority of independent Redis masters.

    ::

        redlock = aiolock.RedLock([client_a, client_b, client_c], "orders:42")
        async with redlock.acquire(wait=5) as guard:
            ...

    ``clients`` are :class:`~aiolock.Client` objects of independent masters (no replication
    between them; at least 3).  A grant needs ``len(clients) // 2 + 1`` of them within the
    validity time; ``lease=None`` keeps every part alive with its client's watchdog, and the
    guard is lost once fewer than a majority of parts are still held.  The fencing token is
    the largest of the servers' tokens.

    Know its limits before relying on it for correctness.  Its safety rests on timing: a
    process paused (GC, swapping) or a server whose clock jumps can outlive its lease and act
    while another process holds the lock, and nothing in the algorithm can stop such a stale
    holder (Martin Kleppmann, "How to do distributed locking", 2016).  Its fencing token is
    the maximum over independent counters, which is weaker than a token from a consensus
    system: two grants can only be ordered if they shared a server.  Pass the token to the
    storage you protect anyway, and prefer a single lock (or a consensus system such as etcd
    or ZooKeeper) when a stale writer would be harmful rather than merely wasteful.
    """

    __slots__ = ("clients", "name", "parts", "quorum")

    @teaching
    def __init__(self, clients: Sequence[Client], name: str, *, owner: str | None = None) -> None:
        from .client import Client

        if isinstance(clients, str | bytes) or not isinstance(clients, Sequence):
            raise TypeError(f"clients must be a sequence of Clients, not {type(clients).__name__}")
        for client in clients:
            if not isinstance(client, Client):
                raise TypeError(f"clients must be aiolock Clients, not {type(client).__name__}")
        if len(clients) < 3:
            raise ValueError(f"clients must name at least 3 servers, got {len(clients)}")
        if len({id(client) for client in clients}) != len(clients):
            raise ValueError("clients must be distinct")
        check_name(name)
        self.clients = tuple(clients)
        self.name = name
        self.parts: tuple[AsyncRLock, ...] = tuple(
            client.lock(name, owner=owner) for client in clients
        )
        self.quorum = len(clients) // 2 + 1
        self._guards = None

    # -- acquiring ---------------------------------------------------------------------------

    @teaching
    async def try_lock(self, wait: float | None = 0, lease: float | None = None) -> bool:
        """Hold the lock on a majority, retrying until ``wait`` runs out (``None``: forever)."""
        return await self._traced_take(check_wait(wait), check_lease(lease)) is not None

    @teaching
    def lock(self, lease: float | None = None) -> Coroutine[Any, Any, None]:
        """Hold the lock on a majority, waiting as long as it takes."""
        return self._hold(check_lease(lease))

    async def _hold(self, lease: float | None) -> None:
        await self._traced_take(None, lease)

    async def _enter(self, wait: float | None, lease: float | None) -> Holding[int]:
        holding = await self._traced_take(wait, lease)
        if holding is None:
            raise LockTimeoutError(f"could not acquire {self.name!r} within {wait}s")
        return holding

    async def _exit(self, holding: Holding[int]) -> None:
        assert isinstance(holding, CompositeHold)
        await holding.release()

    def _traced_take(
        self, wait: float | None, lease: float | None
    ) -> Coroutine[Any, Any, CompositeHold[int] | None]:
        tracing = self.parts[0].services.tracing  # the first part's client
        return traced(tracing, self._take(wait, lease), "redlock", self.name, _parts)

    async def _take(self, wait: float | None, lease: float | None) -> CompositeHold[int] | None:
        loop = asyncio.get_running_loop()
        deadline = math.inf if wait is None else loop.time() + wait
        while True:
            # wait=0 is one attempt however long it takes, as for every kind; any other wait
            # also bounds the calls in flight.
            holding = await self._attempt(lease, deadline if wait else math.inf)
            if holding is not None:
                return holding
            pause = random.uniform(0, _RETRY_DELAY)
            if loop.time() + pause >= deadline:
                return None
            await asyncio.sleep(pause)

    async def _attempt(self, lease: float | None, deadline: float) -> CompositeHold[int] | None:
        """Ask every server at once; keep the grants if a majority came within the validity."""
        loop = asyncio.get_running_loop()
        lease_s = lease if lease is not None else min(c.watchdog_timeout for c in self.clients)
        drift = lease_s * 0.01 + 0.002
        owners = [part.current_owner() for part in self.parts]  # resolved in the calling task
        started = loop.time()
        calls = [
            asyncio.ensure_future(part.acquire_as(owner, task, lease))
            for part, (owner, task) in zip(self.parts, owners, strict=True)
        ]
        # A server that does not answer within the lease cannot be part of a valid grant, nor
        # one that answers after the caller's deadline.
        timeout = max(min(lease_s - drift, deadline - started), 0.001)
        try:
            await asyncio.wait(calls, timeout=timeout)
        except asyncio.CancelledError:
            await self._give_back(calls, deadline)
            raise
        # Every call done by now counts, also one that finished after the wait returned.
        granted = [i for i, call in enumerate(calls) if _granted(call)]
        validity = lease_s - (loop.time() - started) - drift
        if len(granted) >= self.quorum and validity > 0:
            _cancel_late(calls)
            parts = [_hold(calls[i]) for i in granted]
            locks = [self.parts[i] for i in granted]
            return CompositeHold(locks, parts, self.quorum, max(part.token for part in parts))
        await self._give_back(calls, deadline)
        return None

    async def _give_back(
        self, calls: Sequence[asyncio.Future[Hold | float]], deadline: float
    ) -> None:
        """Release the parts of a failed attempt wherever they were granted.

        The calls still running are cancelled: each part undoes its own grant if it lands
        late.  The granted ones are released at once, without waiting for those (a caller
        cancelled meanwhile would leave them held); their releases finish even if the caller
        is cancelled, or when the caller's ``deadline`` comes first, in the background.
        Errors are not raised: a part whose release failed is settled in the background by
        its own lock, and its lease ends it in any case.
        """
        _cancel_late(calls)
        holds = [(self.parts[i], _hold(call)) for i, call in enumerate(calls) if _granted(call)]
        releases = start_releases(
            [part.release_one(hold.owner) for part, hold in holds if not hold.check_lost()]
        )
        now = asyncio.get_running_loop().time()
        await asyncio.wait([releases], timeout=None if deadline == math.inf else deadline - now)

    # -- releasing ---------------------------------------------------------------------------

    @teaching
    async def unlock(self) -> None:
        """Release one hold on every server.

        :raises LockNotOwnedError: if no server had a hold of the caller.
        """
        owners = [part.current_owner()[0] for part in self.parts]
        outcomes = await release_all(
            [part.release_one(owner) for part, owner in zip(self.parts, owners, strict=True)]
        )
        if all(outcome is None or isinstance(outcome, _FAILURES) for outcome in outcomes):
            what = f"lock {self.name!r}"
            if any(map(AsyncRLock.held_by_another_task, self.parts, owners)):
                raise LockNotOwnedError(held_by_another_task(what))
            raise LockNotOwnedError(f"{what} is not held by this owner")

    async def force_unlock(self) -> bool:
        """Delete the lock on every server whoever holds it; ``True`` if it existed on any."""
        outcomes = await asyncio.gather(
            *(part.force_unlock() for part in self.parts), return_exceptions=True
        )
        return any(outcome is True for outcome in outcomes)

    # -- inspecting --------------------------------------------------------------------------

    async def _gather(self, calls: Sequence[Awaitable[Any]]) -> list[Any]:
        """Each server's answer, or ``None`` for one that could not be asked."""
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        return [None if isinstance(outcome, _FAILURES) else outcome for outcome in outcomes]

    async def is_locked(self) -> bool:
        """``True`` if a majority of servers have the lock held."""
        locked = await self._gather([part.is_locked() for part in self.parts])
        return sum(bool(value) for value in locked) >= self.quorum

    async def is_held(self) -> bool:
        """``True`` if a majority of servers have it held by the caller."""
        held = await self._gather(
            [part.read("hget", part.current_owner()[0]) for part in self.parts]
        )
        return sum(bool(value) for value in held) >= self.quorum

    async def hold_count(self) -> int:
        """The caller's reentrant count that a majority of servers agree on (0: not held)."""
        counts = await self._gather(
            [part.read("hget", part.current_owner()[0]) for part in self.parts]
        )
        ranked = sorted((int(count or 0) for count in counts), reverse=True)
        return ranked[self.quorum - 1]

    async def remaining_lease(self) -> float | None:
        """Seconds until fewer than a majority of servers hold it; ``None`` if not locked."""
        leases = await self._gather([part.remaining_lease() for part in self.parts])
        ranked = sorted((lease for lease in leases if lease is not None), reverse=True)
        return ranked[self.quorum - 1] if len(ranked) >= self.quorum else None

    def statistics(self) -> CompositeStatistics:
        """Each server's statistics of the lock, and how many times a majority holds it."""
        parts = tuple(part.statistics() for part in self.parts)
        held = sorted((part.held for part in parts), reverse=True)[self.quorum - 1]
        return CompositeStatistics(
            name=self.name, held=held, lost=any(p.lost for p in parts), parts=parts
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        state = f"held x{stats.held}" if stats.held else "unlocked"
        return f"<RedLock {self.name!r} [{state}, servers:{len(self.parts)}]>"


def _granted(call: asyncio.Future[Hold | float]) -> bool:
    """The call is over and granted its part (a call still running has granted nothing yet)."""
    if not call.done() or call.cancelled():
        return False
    return call.exception() is None and isinstance(call.result(), Hold)


def _cancel_late(calls: Sequence[asyncio.Future[Hold | float]]) -> None:
    """Cancel the calls still running; each part settles its own (undoes a late grant)."""
    for call in calls:
        if not call.done():
            call.cancel()
            call.add_done_callback(_retrieve)


def _retrieve(call: asyncio.Future[Hold | float]) -> None:
    if not call.cancelled():
        call.exception()  # seen: a failure of a call nobody waits for is not an error


def _hold(call: asyncio.Future[Hold | float]) -> Hold:
    hold = call.result()
    assert isinstance(hold, Hold)
    return hold


def _parts(holding: CompositeHold[int] | None) -> tuple[Hold, ...]:
    """The servers' holds of a RedLock acquire's result (none: the wait ran out)."""
    return () if holding is None else holding.parts
