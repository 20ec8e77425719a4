"""``AsyncFairLock``: first come, first served across every client, with the queue in Redis.

A kind on the shared base (:mod:`aiolock._core.base`) with the scripts in ``scripts/fair/``: the
lock hash of the plain lock, plus a queue of waiting owners (tickets) and their deadlines on
the server's clock.  A try that does not get the lock takes (or keeps) the owner's place and
moves its deadline on; a release grants the lock to exactly the next waiter itself, and tells
it with one message on the channel of that waiter's client, naming it and carrying the grant
(:class:`~aiolock._core.waiting.NamedWait`), so there is no herd however many clients wait, no
channel per waiting task, and the waiter starts with no further call.

**The hand-off by message.**  The grant's lease is counted on the waiter's clock from a safe
lower bound of the moment the server made it (:class:`~aiolock._core.clock.ServerClock`,
sampled by every queued try, whose reply carries the server's time), never from the message's
arrival.  Its lease is the one the waiter's last try asked for, at most ``fair_wait_timeout``
(a grant to a waiter that vanished blocks the lock no longer than a vanished head did); a
``lease=None`` hold so granted has its first renewal brought forward.  A grant the waiter
cannot count on (no clock sample, too little lease left, a capped explicit lease, an owner
its client holds already) is taken by a try instead: the server marks grants from the queue
(``':q'``), and a try of an owner its client knows no hold of (``fresh``) adopts such a grant
as its one hold, which also covers a lost message and a try in flight when the release
granted.  A waiter that leaves without the lock (timeout, cancellation) withdraws with
``fresh`` too, which takes back a grant its client never took.

Waiters that give up withdraw from the queue at once (a ``withdraw`` script, settled in the
background like any call whose caller has gone); one whose process died stops having its
deadline moved on and is dropped, once it is next, after ``fair_wait_timeout``.  A parked
waiter does not re-try to keep its place: one :class:`KeepAlive` per lock name and client
moves the deadlines of all its parked waiters on every third of the timeout in one call
(``keep.lua``), so a live waiter is never dropped, and a thousand parked waiters cost one call
per third of it, not a thousand tries.

A lease that runs out publishes nothing, so a parked waiter is bounded by the lease left of the
hold in front of it: its try returns it, and a grant from the queue tells the next in line with
a bound message (``+<ms> <owner>``, :meth:`~aiolock._redis.pubsub.NamedEntry.bound_named`) when the
new lease ends (that waiter may be parked until the end of a longer hold, released early).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.exceptions import RedisError

from . import _scripts
from ._core.base import Call, LockKind, release_args
from ._core.clock import ServerClock
from ._core.holds import Hold
from ._core.keys import LockKeys
from ._core.services import Services
from ._core.settlement import Attempt
from ._core.waiting import NamedWait, Waiting
from ._redis.pubsub import Grant

__all__ = ["AsyncFairLock", "KeepAlive"]

logger = logging.getLogger("aiolock.lock")

_TRIES_IN_FLIGHT = 4
"""Tries of one fair lock name a client has in flight at once (see KeepAlive.tries)."""

_SHORTEST_GRANT = 0.05
"""The least lease (s), as the client counts it, a grant by message must have left to be taken
without a try (and at least a third of its lease)."""


@dataclass(frozen=True, slots=True)
class FairKeys(LockKeys):
    """The plain lock's keys, plus the queue: ``queue`` (owner -> ticket), ``queued`` (owner
    -> what a grant from the queue needs, and the server time in ms after which the waiter is
    dropped), and the wake-up channels ``<wake_prefix><client id>``; ``channel`` is this
    client's."""

    queue: str
    queued: str
    wake_prefix: str

    def script_keys(self) -> tuple[str, ...]:
        return (self.lock, self.meta, self.queue, self.queued, self.wake_prefix, self.fence)


class KeepAlive:
    """Keeps the queue places of one client's parked waiters on one fair lock.

    While any of them is parked, every third of ``fair_wait_timeout`` one call (``keep.lua``)
    moves all their deadlines on; an owner the server no longer has in the queue (dropped while
    its client stalled, say) is woken to try again.  The same call drops vanished waiters at
    the head of the queue while the lock is free and wakes the first live one; if that one's
    deadline is nearer than the next call, the next call comes at its deadline (it may have
    vanished too), and while the lock is held, at the end of its lease if that is nearer
    (expiry publishes nothing).  Shared by the
    waiting calls of the name (through the client's name cache); a failed call is logged and
    the next one comes a third of the timeout later (the places last the whole timeout).
    """

    __slots__ = (
        "__weakref__",
        "_keys",
        "_services",
        "_task",
        "_timer",
        "_waiters",
        "clock",
        "once",
        "tries",
    )

    def __init__(self, services: Services, keys: tuple[str, ...]) -> None:
        self._services = services
        self._keys = keys
        # Bounds the tries of this name in flight from this client.  Thousands of waiters
        # arriving at once each queue with a try; one waiting here costs a future, one waiting
        # for a connection inside the call costs its whole chain of call frames.
        self.tries = asyncio.Semaphore(_TRIES_IN_FLIGHT)
        # The server's clock against the loop's, from the name's queued tries: per name, so
        # that on a Cluster it is the clock of the node the name lives on.
        self.clock = ServerClock()
        # Owners making one attempt that will not wait (try_lock(wait=0), a composite's part),
        # with how many such calls each has in flight: their tries ask for no grant from the
        # queue (the withdraw that follows a refusal would have to take it back).
        self.once: dict[str, int] = {}
        self._waiters: dict[str, NamedWait] = {}  # the parked owners, and how to wake them
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None  # a keep-alive call in flight

    def add(self, owner: str, wait: NamedWait) -> None:
        self._waiters[owner] = wait
        if self._timer is None and self._task is None:
            self._arm()

    def discard(self, owner: str) -> None:
        self._waiters.pop(owner, None)
        if not self._waiters and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, due: float = math.inf) -> None:
        loop = asyncio.get_running_loop()
        delay = min(self._services.fair_wait_timeout / 3, due)
        self._timer = loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._waiters and not self._services.closed:
            self._task = asyncio.get_running_loop().create_task(self._keep(list(self._waiters)))

    async def _keep(self, owners: list[str]) -> None:
        services = self._services
        wait_ms = round(services.fair_wait_timeout * 1000)
        missing: list[bytes | str] = []
        due = math.inf
        try:
            call = (_scripts.FAIR_KEEP, self._keys, (wait_ms, *owners))
            missing, due_ms = await services.calls.run(*call)
            if due_ms:
                # Sooner than a third of the timeout: the deadline of the head of a free
                # lock's queue (it may be gone), or the end of a lease held now.
                due = int(due_ms) / 1000
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: the client closed
            if not services.closed:
                logger.warning(
                    "keeping the places of %d fair waiter(s) failed: %r", len(owners), exc
                )
        finally:
            self._task = None
        for name in missing:
            wait = self._waiters.get(name.decode() if isinstance(name, bytes) else name)
            if wait is not None:
                wait.wake()
        if self._waiters and not services.closed:
            self._arm(due)


class AsyncFairLock(LockKind):
    """A reentrant lock granted in the order waiters first asked, across all clients.

    Create it with :meth:`aiolock.Client.fair_lock`; it offers every call of
    :class:`~aiolock.AsyncRLock` with the same semantics.  Choose it when waiters in many
    processes contend for one lock: each hand-off costs one message to one client, where the
    plain lock wakes one waiter in every client and lets them race.

    A waiter that gives up leaves the queue at once; one that vanished (its process killed)
    delays those behind it by at most the client's ``fair_wait_timeout``.  Deadlines in the
    queue use the server's clock, so clock skew between clients cannot reorder or stall it.
    """

    __slots__ = ()

    kind: ClassVar[str] = "fair"
    _renew = _scripts.LOCK_RENEW

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        base = LockKeys.build(services.key_prefix, name, cls.kind, cluster=services.cluster)
        wake_prefix = f"{base.lock}:c:"
        return FairKeys(
            lock=base.lock,
            meta=base.meta,
            fence=base.fence,
            channel=wake_prefix + services.owners.client_id,
            queue=f"{base.lock}:q",
            queued=f"{base.lock}:qa",
            wake_prefix=wake_prefix,
        )

    def _script_keys(self) -> tuple[str, ...]:
        keys = self._keys
        assert isinstance(keys, FairKeys)
        return keys.script_keys()

    def _attempt(self, owner: str, request: int, lease_ms: int) -> Call:
        wait_ms = round(self._services.fair_wait_timeout * 1000)
        args = (lease_ms, owner, request, wait_ms, *self._late_args(owner), *self._fresh(owner))
        if owner in self._keeper().once:
            args = (*args, "once")
        return _scripts.FAIR_ACQUIRE, self._script_keys(), args

    def _fresh(self, owner: str) -> tuple[str, ...]:
        """``fresh`` when the client knows no hold of ``owner`` on this lock: the server may
        then count a grant from the queue it marked as this call's (see the module doc)."""
        return ("fresh",) if self._services.holds.get(self._hold_key, owner) is None else ()

    async def _acquire_as(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None
    ) -> Hold | float:
        keeper = self._keeper()  # kept alive by this frame, with its record of the call
        once = keeper.once
        once[owner] = once.get(owner, 0) + 1
        try:
            return await super()._acquire_as(owner, task, lease)
        finally:
            if once[owner] == 1:
                del once[owner]
            else:
                once[owner] -= 1

    def _busy(self, attempt: Attempt, reply: Any) -> float:
        """A queued try answers ``'<pause ms> <server time ms>'``: the pause, and a sample of
        the server's clock (a late copy's refusal answers the pause alone)."""
        if isinstance(reply, bytes):
            reply = reply.decode()
        if isinstance(reply, str):
            pause, _, server_ms = reply.partition(" ")
            if server_ms:
                self._keeper().clock.sample(attempt.sent_at, int(server_ms))
            reply = int(pause)
        return super()._busy(attempt, reply)

    def _accept(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: Grant,
    ) -> Hold | None:
        """Record a grant from the queue its message brought, counting its lease from a lower
        bound of the moment the server made it; ``None`` when it cannot be counted on (the
        wait loop then tries, which adopts it: see the module docstring)."""
        services = self._services
        if services.holds.get(self._hold_key, owner) is not None:
            return None  # an explicit owner another task holds with: a try re-enters
        now = asyncio.get_running_loop().time()
        granted_at = self._keeper().clock.lower_bound(grant.server_ms, now)
        if granted_at is None:
            return None
        asked = round((services.watchdog_timeout if lease is None else lease) * 1000)
        if grant.lease_ms > asked or (grant.lease_ms < asked and lease is not None):
            return None  # capped at the wait timeout: a try gets the lease asked for
        left = granted_at + grant.lease_ms / 1000 - now
        if left < max(grant.lease_ms / 3000, _SHORTEST_GRANT):
            return None
        attempt = Attempt(owner, grant.request, asked / 1000, granted_at)
        reply = [grant.token, 1, grant.lease_ms]
        hold = self._record(attempt, reply, task, started, watchdog=lease is None)
        if grant.lease_ms < asked:  # a lease=None hold, granted for the wait timeout
            services.watchdog.renew_by(now + left / 3)
        return hold

    def _release_call(self, owner: str, request: int, undo: int | None) -> Call:
        args = release_args(owner, request, undo)
        return _scripts.FAIR_RELEASE, self._script_keys(), args

    def _force_call(self) -> Call:
        return _scripts.FAIR_FORCE, self._script_keys(), ()

    def _keeper(self) -> KeepAlive:
        services = self._services
        return services.name_state(
            "fair-keep", self.name, lambda: KeepAlive(services, self._script_keys())
        )

    def _waiting(self, owner: str) -> Waiting:
        return NamedWait(self._services, self._keys.channel, self._counters, owner, self._keeper())

    async def _try_acquire(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None, started: float
    ) -> Hold | float:
        keeper = self._keeper()  # kept alive by this frame: its semaphore is the name's
        async with keeper.tries:
            return await super()._try_acquire(owner, task, lease, started)

    def _withdraw_call(self, owner: str) -> Call:
        # With fresh, it also takes back a grant from the queue its client never took.
        return _scripts.FAIR_WITHDRAW, self._script_keys(), (owner, *self._fresh(owner))
