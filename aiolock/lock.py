"""``AsyncRLock``: the reentrant distributed lock, Redisson's ``RLock`` for asyncio.

A kind on the shared engine (:mod:`aiolock._core.kind`): the scripts in ``scripts/lock/``, and
waiters parked on the lock's pub/sub channel; a release names the one client that wakes one
of its waiters (:class:`~aiolock._core.waiting.ClientWait`, ``scripts/lock/_waiting.lua``).  A
release published before the subscription existed is not missed: the SUBSCRIBE's confirmation
wakes one waiter too (see :mod:`aiolock._redis.pubsub`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

from redis.exceptions import RedisError

from . import _scripts
from ._core.guard import LockGuard
from ._core.holds import Hold
from ._core.hooks import Call, release_args
from ._core.keys import LockKeys
from ._core.kind import LockKind
from ._core.services import Services
from ._core.settlement import Attempt
from ._core.state import LockStatistics
from ._core.waiting import ClientWait, WaitStrategy

__all__ = ["AsyncRLock", "LockGuard", "LockStatistics", "ReentrantKind"]

logger = logging.getLogger("aiolock.lock")


def command_release_fields(owner: str) -> tuple[str, ...]:
    """The fields of the lock hash the release by a bare ``HDEL`` removes: ``owner``'s hold
    (its count, ``f:``, ``r:``, and ``x:`` and ``:late:`` if a fault left them) and ``:w``; the
    same list as ``fair/last.lua``'s (``scripts/common/_hold.lua`` says which fields a hold has)."""
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
        if not self._published():
            return (
                _scripts.LOCK_ACQUIRE,
                (keys.lock, keys.meta, keys.fence),
                (lease_ms, owner, request, "0", *self._late_args(owner)),
            )
        return (
            _scripts.LOCK_ACQUIRE,
            (keys.lock, keys.meta, keys.fence, keys.waiting),
            (lease_ms, owner, request, self._entering(), *self._late_args(owner)),
        )

    def _entering(self) -> str:
        """How a refusal of this try enters the client in the lock's waiting set
        (``lock/acquire.lua``'s ARGV[4]): ``0`` if no call of this client will park (a
        ``try_lock()`` with no wait); ``!`` first if a grant must name the next client at its
        release (calls of this client have parked, or others are after the lock), ``~`` if it
        must also take the client out of the set (this call, which parked, is its last)."""
        counters = self._counters
        if not counters.contenders:
            return "0"
        if counters.contenders > 1:
            mark = "!"
        elif counters.waiters:
            mark = "~"
        else:
            mark = ""
        return f"{mark}{time.time_ns() // 1_000} {self._client} {self._kept_ms()}"

    @property
    def _client(self) -> str:
        return self._services.owners.client_id

    def _kept_ms(self) -> int:
        """How long an entry of this client keeps the waiting set alive: its waiters park
        under a watchdog lease at most (a fixed lease's refusal keeps it for that lease)."""
        return round(self._services.watchdog_timeout * 1000) + 2000

    def _more(self) -> str:
        """``lock/release.lua``'s ARGV[3]: this client enters the waiting set behind the
        others if calls of its own wait (and keeps the set alive, now and then)."""
        counters = self._counters
        if not counters.contenders or not self._published():
            return ""
        more = f"{time.time_ns() // 1_000} {self._client}"
        now = time.monotonic()
        if now >= counters.waiting_kept_until:
            kept = self._kept_ms()
            counters.waiting_kept_until = now + kept / 2000
            more = f"{more} {kept}"
        return more

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        # ``lock/acquire.lua`` answers a fault-free fresh hold with its token alone, and a
        # refusal with {pttl}.
        if isinstance(reply, int):
            return [reply, 1, lease_ms]
        return reply if len(reply) == 3 else None

    def _refusal_pause(self, attempt: Attempt, reply: Any) -> float:
        return super()._refusal_pause(attempt, reply[0])

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        keys = self._keys
        args = release_args(owner, request, undo)
        if not self._published():
            return _scripts.LOCK_RELEASE, (keys.lock, keys.meta), (*args[:2], "", *args[2:])
        return (
            _scripts.LOCK_RELEASE,
            (keys.lock, keys.meta, keys.channel, keys.waiting),
            (*args[:2], self._more(), *args[2:]),
        )

    def _force_call(self) -> Call:
        return _scripts.LOCK_FORCE, (self._keys.lock, *self._published()), ()

    def _last_release_command(self, hold: Hold) -> tuple[Any, ...] | None:
        """``HDEL`` of the owner's fields (its count, ``f:``, ``r:``, and ``x:`` and ``:late:``
        if a fault left them) and ``:w``: every field of a hold is named by its owner
        (``scripts/common/_hold.lua``), so it ends that hold and no other owner's, in one bare
        command instead of a script.  Not for a hold whose acquire was refused on the way (the
        lock is contended: the release script publishes in the same call, where this would
        publish after its reply), nor while tasks of this client wait for the lock."""
        return self.plain_release(hold.owner, contended=hold.contended)

    def plain_release(self, owner: str, *, contended: bool) -> tuple[Any, ...] | None:
        """The ``HDEL`` that ends ``owner``'s one fault-free hold (``contended``: see
        :attr:`Hold.contended`), or ``None`` when the release script must (see
        :meth:`_last_release_command`).  No I/O, dict reads only: aiolock.sync's calling
        thread asks it too, before it sends the release itself."""
        if self._published() and (contended or self._counters.contenders):
            return None
        return ("HDEL", self._keys.lock, *command_release_fields(owner))


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
    channel, and a release wakes one waiter in all, in the client it names.  The remaining
    lease bounds every wait, so a lost message only delays a waiter.  Waiters of one client
    are served in order; clients take turns, and a newcomer may take a free lock first (see
    :meth:`aiolock.Client.fair_lock` for a queue across clients).

    Not to be confused with :class:`asyncio.Lock`: this lock lives in Redis, its leases can run
    out, and leaving a :class:`LockGuard` block after a loss raises :class:`LockLostError`.
    """

    __slots__ = ()

    kind: ClassVar[str] = "lock"

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        # The first kind: its keys carry no kind segment.
        return LockKeys.build(services.key_prefix, name, cluster=services.cluster)

    def _channels(self) -> tuple[str, ...]:
        return (self._keys.channel,)

    def _wait_strategy(self, owner: str) -> WaitStrategy:
        services = self._services
        reentering = services.holds.get(self._registry_key, owner) is not None
        return ClientWait(
            services,
            self._keys.channel,
            self._counters,
            reentering=reentering,
            lock=self,
            owner=owner,
        )

    def hand_on(self, owner: str) -> None:
        """The last waiting call of this client left without the lock (see ``ClientWait``)."""
        self._services.holds.defer(self._keys.lock, owner, self._hand_on(self._client))

    async def wake_others(self) -> None:
        """Name the next client to wake, as the release script would have (a release by a bare
        command removed ``:w``)."""
        await self._hand_on(None)

    async def _hand_on(self, client: str | None) -> None:
        """Take ``client`` (the last of its calls left the wait) out of the waiting set, or
        hand on the wake-up a release sent it; with no client, name the next one
        (``lock/wake.lua``)."""
        keys = self._keys
        try:
            await self._services.calls.run(
                _scripts.LOCK_WAKE,
                (keys.lock, keys.waiting, keys.channel),
                () if client is None else (client,),
            )
        except RedisError as exc:  # the waiters' own pause bounds their wait
            logger.warning("could not wake the next waiter of %r: %r", self.name, exc)
