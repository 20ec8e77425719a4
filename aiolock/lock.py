"""``AsyncRLock``: the reentrant distributed lock, Redisson's ``RLock`` for asyncio.

A kind on the shared engine (:mod:`aiolock._core.kind`): the scripts in ``scripts/lock/``, and
waiters parked on the lock's pub/sub channel, one wake-up per release
(:class:`~aiolock._core.waiting.ChannelWait`).  A release published before the subscription
existed is not missed: the SUBSCRIBE's confirmation wakes one waiter too (see
:mod:`aiolock._redis.pubsub`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import _scripts
from ._core.guard import LockGuard
from ._core.holds import Hold
from ._core.hooks import Call, release_args
from ._core.keys import LockKeys
from ._core.kind import LockKind, LockStatistics
from ._core.services import Services
from ._core.settlement import Attempt
from ._core.waiting import ChannelWait, Waiting

__all__ = ["AsyncRLock", "LockGuard", "LockStatistics", "ReentrantKind"]


def plain_release_fields(owner: str) -> tuple[str, ...]:
    """The fields of the lock hash the plain release removes: ``owner``'s hold (its count,
    ``f:``, ``r:``, and ``x:`` and ``:late:`` if a fault left them) and ``:w``; the same list
    as ``fair/last.lua``'s (``scripts/common/_hold.lua`` says which fields a hold has)."""
    return (owner, f"f:{owner}", f"r:{owner}", ":w", f"x:{owner}", f":late:{owner}")


class ReentrantKind(LockKind):
    """The scripts of the reentrant lock (``scripts/lock/``), shared by the kinds that differ
    from it only in how they wait (the plain lock and the spin lock)."""

    __slots__ = ()

    _renew = _scripts.LOCK_RENEW

    def _published(self) -> tuple[str, ...]:
        """The channel a release publishes on, as script keys: none if nobody subscribes."""
        return (self._keys.channel,)

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        keys = self._keys
        parks = 1 if self._published() else 0  # a refusal marks the lock as waited for
        return (
            _scripts.LOCK_ACQUIRE,
            (keys.lock, keys.meta, keys.fence),
            (lease_ms, owner, request, parks, *self._late_args(owner)),
        )

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        # ``lock/acquire.lua`` answers a fault-free fresh hold with its token alone, and a
        # refusal with {pttl}.
        if isinstance(reply, int):
            return [reply, 1, lease_ms]
        return reply if len(reply) == 3 else None

    def _busy(self, attempt: Attempt, reply: Any) -> float:
        return super()._busy(attempt, reply[0])

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        keys = self._keys
        return (
            _scripts.LOCK_RELEASE,
            (keys.lock, keys.meta, *self._published()),
            release_args(owner, request, undo),
        )

    def _force_call(self) -> Call:
        return _scripts.LOCK_FORCE, (self._keys.lock, *self._published()), ()

    def _last_release_command(self, hold: Hold) -> tuple[Any, ...] | None:
        """``HDEL`` of the owner's fields (its count, ``f:``, ``r:``, and ``x:`` and ``:late:``
        if a fault left them) and ``:w``: every field of a hold is named by its owner
        (``scripts/common/_hold.lua``), so it ends that hold and no other owner's, in one plain
        command instead of a script.  Not for a hold whose acquire was refused on the way (the
        lock is contended: the release script publishes in the same call, where this would
        publish after its reply), nor while tasks of this client wait for the lock."""
        if self._published() and (hold.contended or self._counters.contenders):
            return None
        return ("HDEL", self._keys.lock, *plain_release_fields(hold.owner))


class AsyncRLock(ReentrantKind):
    """A reentrant lock shared by every process that uses the same Redis and ``name``.

    Create it with :meth:`aiolock.Client.lock`; creating it does no I/O::

        lock = client.lock("orders:42")
        async with lock.acquire(wait=5) as guard:
            await save(order, fence=guard.fencing_token)

    The owner is the calling *task* (plus the client's id): the same task may acquire again, and
    each acquisition needs one release.  ``client.lock(name, owner="job-17")`` binds the object
    to an explicit owner instead, so one task may acquire and another release.  Because the
    owner is the task, ``asyncio.gather(*(lock.unlock() ...))`` does not work: ``gather`` runs
    each call in a new task, which does not own the lock.

    ``lease=None`` (the default) keeps the lock alive with the client's watchdog for as long as
    the owner holds it; a number of seconds makes the lock expire that long after it was taken,
    unless it is released first.  Waiting does not poll: a waiter parks on the lock's pub/sub
    channel, and a release wakes one waiter per client.  The remaining lease bounds every wait,
    so a lost message only delays a waiter.  Waiters of one client are served in order; across
    clients they race (see :meth:`aiolock.Client.fair_lock` for a queue across clients).

    Not to be confused with :class:`asyncio.Lock`: this lock lives in Redis, its leases can run
    out, and leaving a :class:`LockGuard` block after a loss raises :class:`LockLostError`.
    """

    __slots__ = ()

    kind: ClassVar[str] = "lock"
    # A release publishes only if a waiter was refused since the grant: a waiter may park on
    # the channel.  The spin lock's waiters never do, and its release never publishes.
    _publishes_if_refused: ClassVar[bool] = True

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        # The first kind: its keys carry no kind segment.
        return LockKeys.build(services.key_prefix, name, cluster=services.cluster)

    def _channels(self) -> tuple[str, ...]:
        return (self._keys.channel,)

    def _waiting(self, owner: str) -> Waiting:
        reentering = self._services.holds.get(self._hold_key, owner) is not None
        return ChannelWait(
            self._services, self._keys.channel, self._counters, reentering=reentering
        )
