"""``AsyncRLock``: the reentrant distributed lock, Redisson's ``RLock`` for asyncio.

A kind on the shared engine (:mod:`aiolock._core.kind`): the scripts in ``scripts/lock/``, and
waiters parked on the lock's pub/sub channel; a release grants the lock to the first owner of
its waiting set and tells its client, one message in all, whose waiting call starts with no
further try (:mod:`aiolock._core.line`, ``scripts/lock/_waiting.lua``).  A grant published
before the subscription existed is not missed: the SUBSCRIBE's confirmation wakes the owners
that have a place, whose try takes it (see :mod:`aiolock._redis.pubsub`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
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
from ._core.line import GRANT_LEASE_MS, ClientWait, Line, LineGrant
from ._core.services import Services
from ._core.settlement import Attempt, grant_message
from ._core.state import LockStatistics
from ._core.waiting import MessageGrant, WaitStrategy

__all__ = ["AsyncRLock", "LockGuard", "LockStatistics", "ReentrantKind"]

logger = logging.getLogger("aiolock.lock")


def wake_prefix(lock_key: str) -> str:
    """The prefix of the plain lock's channels, ``<prefix><client id>``: a release tells the
    client it grants the lock to, and no other (the lock's hash tag keeps them in its slot)."""
    return f"{lock_key}:c:"


def command_release_fields(owner: str) -> tuple[str, ...]:
    """The fields of the lock hash the release by a bare ``HDEL`` removes: ``owner``'s hold
    (its count, ``f:``, ``r:``, ``q:`` if it was granted from the waiting set, and ``x:`` and
    ``:late:`` if a fault left them) and ``:w``; the same list as ``fair/last.lua``'s
    (``scripts/common/_hold.lua`` says which fields a hold has)."""
    return (owner, f"f:{owner}", f"r:{owner}", ":w", f"x:{owner}", f":late:{owner}", f"q:{owner}")


class ReentrantKind(LockKind):
    """The scripts of the reentrant lock (``scripts/lock/``), shared by the kinds that differ
    from it only in how they wait (the plain lock and the spin lock)."""

    __slots__ = ()

    _renew = _scripts.LOCK_RENEW

    def _published(self) -> tuple[str, ...]:
        """The prefix of the channels a release publishes on (``<prefix><client id>``: one
        per client), as script keys: none if nobody subscribes."""
        return (wake_prefix(self._keys.lock),)

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
            (
                lease_ms,
                owner,
                request,
                self._entering(owner, request, lease_ms),
                *self._late_args(owner),
            ),
        )

    def _line(self) -> Line | None:
        """This client's line of waiting calls on the lock, if a call has waited."""
        line = self._state.line
        return line if isinstance(line, Line) else None

    def _entering(self, owner: str, request: int, lease_ms: int) -> str:
        """How a refusal of this try enters the owner in the lock's waiting set
        (``lock/acquire.lua``'s ARGV[4]): ``0`` if no call of the owner waits (a
        ``try_lock()`` with no wait, a composite's part); ``!`` first if a grant must hand the
        lock over at its release (other calls of this client wait), ``~`` if it must also take
        the owner's member out of the set (the owner has a place already)."""
        line = self._line()
        lease_ms = min(lease_ms, GRANT_LEASE_MS)
        place = None if line is None else line.place_for(owner, request, lease_ms)
        if place is None:
            return "0"
        order, member, placed = place
        mark = "~" if placed else "!" if self._counters.contenders > 1 else ""
        return f"{mark}{order} {self._kept_ms()} {member}"

    def _kept_ms(self) -> int:
        """How long an entry of this client keeps the waiting set alive: behind another
        client's hold its waiters try again within a watchdog lease (a fixed lease's refusal
        keeps it for that lease); behind a hold of this client they try no more, and its
        release enters their place again if the set may have expired (``Line.next_entry``)."""
        return round(self._services.watchdog_timeout * 1000) + 2000

    def _more(self, owner: str) -> str:
        """``lock/release.lua``'s ARGV[3]: the first call of this client waiting behind
        ``owner``'s hold enters the waiting set if no owner of this client has a place (and
        keeps the set alive, now and then).  From any thread (aiolock.sync's releases)."""
        line = self._line()
        if line is None or not self._counters.contenders:
            return ""
        counters = self._counters
        kept = "-"
        kept_ms = self._kept_ms()
        now = time.monotonic()
        if now >= counters.waiting_kept_until:
            counters.waiting_kept_until = now + kept_ms / 2000
            kept = str(kept_ms)
        hold = self._services.holds.get(self._registry_key, owner)
        held = None if hold is None else (hold.confirmed_at, hold.token)
        return line.next_entry(
            owner, kept, self._services.owners.next_request(), held, kept_ms=kept_ms
        )

    def claim(self, message: bytes, task: object) -> tuple[ClientWait, LineGrant] | None:
        """From the thread whose release made the grant ``message`` tells: the grant, taken
        for ``task``'s parked call, of a thread of this client (:meth:`Line.claim`), which
        that thread may be told of at once; ``None`` when the loop delivers it as any other."""
        line = self._line()
        return None if line is None else line.claim(message, task)

    def take_claimed(
        self, owner: str, lease: float | None, started: float, grant: LineGrant
    ) -> Hold:
        """On the loop: the hold of a grant claimed for ``owner``'s call (``lease`` and
        ``started`` its own), recorded by whichever comes first of the call's wait loop and
        the post of the thread that claimed it (see :mod:`aiolock._core.line`)."""
        hold = self._services.holds.get(self._registry_key, owner)
        if hold is not None and hold.token == grant.token:
            return hold
        hold = self.record_message_grant(
            owner, None, lease, started, grant, granted_at=grant.since, counted=True
        )
        assert hold is not None, "a counted grant is recorded"
        return hold

    def settle_claimed(
        self, call: ClientWait, lease: float | None, started: float, grant: LineGrant
    ) -> Hold:
        """On the loop, posted by the thread that claimed ``grant`` for ``call``: its hold
        (:meth:`take_claimed`), which the call leaves with (:meth:`ClientWait.hand`)."""
        hold = self.take_claimed(call.owner, lease, started, grant)
        call.hand(hold)
        return hold

    def release_unapplied(self, call: Call) -> None:
        """A release ``call`` (:meth:`release_call`'s) surely changed nothing: refused, or the
        owner held nothing.  The owner it entered in the waiting set (``_more``) is not there.
        From any thread (aiolock.sync's releases)."""
        line = self._line()
        args = call[2]
        if line is not None and len(args) > 2:
            line.not_entered(str(args[2]))  # (an entry of nobody, '' or '+', changes nothing)

    def release_settled(self, call: Call) -> None:
        # The owner it entered in the waiting set (``_more``) may now be withdrawn.
        line = self._line()
        args = call[2]
        if line is not None and len(args) > 2:
            line.carried(str(args[2]))

    def deliver_reply_grant(self, reply: Any) -> None:
        # lock/release.lua answers the grant's message when it grants the lock to a member;
        # the line ignores a member of another client's.
        line = self._line()
        message = grant_message(reply)
        if line is not None and message is not None:
            line.deliver_grant(message, from_reply=True)

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        # ``lock/acquire.lua`` answers a fault-free fresh hold with its token alone, and a
        # refusal with {pttl}.
        if isinstance(reply, int):
            return [reply, 1, lease_ms]
        return reply if len(reply) == 3 else None

    def _refusal_pause(self, attempt: Attempt, reply: Any) -> float:
        line = self._line()
        if line is not None:
            line.refused(attempt.owner, attempt.sent_at)
        return super()._refusal_pause(attempt, reply[0])

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        keys = self._keys
        args = release_args(owner, request, undo)
        if not self._published():
            return _scripts.LOCK_RELEASE, (keys.lock, keys.meta), (*args[:2], "", *args[2:])
        return (
            _scripts.LOCK_RELEASE,
            (keys.lock, keys.meta, *self._published(), keys.waiting, keys.fence),
            (*args[:2], self._more(owner), *args[2:]),
        )

    def _force_call(self) -> Call:
        keys = self._keys
        if not self._published():
            return _scripts.LOCK_FORCE, (keys.lock,), ()
        return _scripts.LOCK_FORCE, (keys.lock, *self._published(), keys.waiting), ()

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
    unless it is released first.  Waiting does not poll: a waiter parks on its client's pub/sub
    channel of the lock, and a release grants the lock to one waiter in all, whose client it
    tells.  The remaining lease bounds every wait, so a lost message only delays a waiter.
    Waiters are served about in the order they began to wait (by each client's clock), and a
    newcomer may take a lock that is free first (see :meth:`aiolock.Client.fair_lock` for a
    queue that promises the order).

    Not to be confused with :class:`asyncio.Lock`: this lock lives in Redis, its leases can run
    out, and leaving a :class:`LockGuard` block after a loss raises :class:`LockLostError`.
    """

    __slots__ = ()

    kind: ClassVar[str] = "lock"

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        # The first kind: its keys carry no kind segment.  Its waiters hear of grants on a
        # channel of their client's own, so a release wakes no other client.
        keys = LockKeys.build(services.key_prefix, name, cluster=services.cluster)
        return dataclasses.replace(keys, channel=wake_prefix(keys.lock) + services.owners.client_id)

    def _channels(self) -> tuple[str, ...]:
        return (self._keys.channel,)

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        services = self._services
        reentering = services.holds.get(self._registry_key, owner) is not None
        line = self._line()
        if line is None:
            answer = services.answer_grant
            line = Line(
                services.owners.client_id,
                asyncio.get_running_loop().time,
                functools.partial(services.holds.watched_on, self._registry_key),
                None if answer is None else functools.partial(answer, self._registry_key),
            )
            self._state.line = line
        return ClientWait(
            services,
            self._keys.channel,
            self._counters,
            reentering=reentering,
            line=line,
            owner=owner,
            asked_ms=round((services.watchdog_timeout if lease is None else lease) * 1000),
            watchdog=lease is None,
        )

    def _accept(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: MessageGrant,
    ) -> Hold | None:
        """Record a grant from the waiting set its message brought, its lease counted from
        before the call that last entered the owner or kept it in (the grant came after it);
        ``None`` when it cannot be counted on (then the next try takes it on the server)."""
        assert isinstance(grant, LineGrant)
        if grant.claimed:
            return grant.hold or self.take_claimed(owner, lease, started, grant)
        services = self._services
        if services.holds.get(self._registry_key, owner) is not None:
            return None  # an explicit owner another task holds with: a try re-enters
        line = self._line()
        if line is not None and line.owner_trying(owner):
            # Another call of the owner has a try out, which may take this grant on the
            # server: a try of this call then re-enters the lock, or takes the grant itself.
            return None
        return self.record_message_grant(owner, task, lease, started, grant, granted_at=grant.since)

    def withdraw_call(self, owner: str) -> Call | None:
        # The owner's place, if it has one: taken out of the set, or its grant given back.
        line = self._line()
        member = None if line is None else line.withdraw(owner)
        if member is None:
            return None
        keys = self._keys
        return (
            _scripts.LOCK_WAKE,
            (keys.lock, keys.waiting, *self._published(), keys.fence),
            (member,),
        )

    def withdraw_after(self, call: Call) -> asyncio.Future[None] | None:
        line = self._line()
        carried = None if line is None else line.after_carried(str(call[2][0]))
        return None if carried is None else asyncio.wrap_future(carried)

    async def wake_others(self) -> None:
        """Hand the lock over to the first owner of its waiting set, as the release script
        would have (a release by a bare command removed ``:w``)."""
        keys = self._keys
        try:
            await self._services.calls.run(
                _scripts.LOCK_WAKE, (keys.lock, keys.waiting, *self._published(), keys.fence), ()
            )
        except RedisError as exc:  # the waiters' own pause bounds their wait
            logger.warning("could not hand over %r: %r", self.name, exc)
