"""Settlement of the calls whose outcome their caller never saw.

**One rule for every state-changing call** (acquire, release): when its outcome is unknown to
its caller (the caller was cancelled, the connection was lost, the reply timed out), it is
settled in the background with the same request id (a grant is undone exactly, a release is
completed), and the owner's next acquire or release on that name waits for the settlement.
The invariant, per (name, owner): once settlements are done, the holds the client believes in
are holds the server has, or are marked lost; the server has no hold of that owner that the
client does not know about.

A :class:`Settlement` is made for one lock when there is something to settle, from the lock's
declared interface (:class:`Settled`, which every kind offers, :mod:`aiolock._core.kind`): the
lock's keys, its client's services, and its release and void calls.  The kind sends the calls;
this module decides what their unknown outcomes leave behind, and cleans it up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol

from redis.exceptions import RedisError, ResponseError

from .._redis.calls import NotSent
from .._scripts import Call
from ..errors import LockSyncError
from .holds import Hold
from .keys import LockKeys
from .metrics import lock_extra
from .services import Services

__all__ = [
    "check_applied",
    "grant_message",
    "Attempt",
    "ReleaseCopies",
    "Settled",
    "Settlement",
    "holds_left",
    "until_it_lands",
]

logger = logging.getLogger("aiolock.lock")

_FAILURES: Final = (RedisError, OSError)

# How long past the lease end the client knows of a background release keeps trying: the
# server counts a lease from when it applied the call, which a stall may have delayed.
_SETTLE_MARGIN: Final = 1.0


async def until_it_lands(
    send: Callable[[], Awaitable[Any]], give_up: float, services: Services
) -> Any:
    """``send()`` an idempotent call again, with a backoff (20 ms doubling to 1 s), until it
    is answered (its reply), ``give_up`` (loop time) has passed or the client closed (the last
    failure is raised).  The last try is at ``give_up``, not a backoff step before it: a
    settlement that ends early would let the owner's next call meet what it was settling."""
    loop = asyncio.get_running_loop()
    delay = 0.02
    while True:
        try:
            return await send()
        except _FAILURES:
            now = loop.time()
            if services.closed or now >= give_up:
                raise
            await asyncio.sleep(min(delay, give_up - now))
            delay = min(delay * 2, 1.0)
            if services.closed:  # closed while this slept: its connections are gone
                raise


class Settled(Protocol):
    """What settlement asks of a lock (every kind offers it: :mod:`aiolock._core.kind`)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def keys(self) -> LockKeys: ...

    @property
    def services(self) -> Services: ...

    @property
    def registry_key(self) -> str: ...

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        """The kind's release of one hold; with ``undo``, only if that acquire was applied."""
        ...

    def release_unapplied(self, call: Call) -> None:
        """A release ``call`` surely changed nothing (refused, or nothing was held)."""
        ...

    def release_settled(self, call: Call) -> None:
        """A release ``call`` changes nothing more on the server (answered, refused, given up)."""
        ...

    def void_call(self, owner: str, requests: list[int]) -> Call:
        """The kind's call that voids the owner's acquire ``requests``."""
        ...

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        """The grant an acquire call's ``reply`` answers; ``None``: the lock was refused."""
        ...

    def wake_others(self) -> Coroutine[Any, Any, None]:
        """Publish a release on the lock's channels, for the waiters of every client."""
        ...


@dataclass(slots=True)
class Attempt:
    """One acquire call as it was sent: what its record and its settlement need.

    :ivar lease: the lease it asks for, in seconds.
    :ivar sent_at: when the copy that answered was written (loop time).
    :ivar resent: some copy was written on a connection that then failed: it may still arrive.
    """

    owner: str
    request: int
    lease: float
    sent_at: float
    resent: bool = False

    def sending(self, resend: bool) -> None:
        """``on_send`` of the call: the reply's lease runs from when the server ran the copy
        that answered (a resend too: the scripts restart its lease), which is written now, so
        a reconnect or a retry's backoff before it must not eat into the lease the client
        counts."""
        self.resent = self.resent or resend
        self.sent_at = asyncio.get_running_loop().time()

    @property
    def lease_ms(self) -> int:
        """The lease as the call sends it, in milliseconds."""
        return round(self.lease * 1000)


class ReleaseCopies:
    """The copies of one release request sent so far (``sending`` is the ``on_send`` of every
    call that sends it).

    :ivar sent: a copy went out (may have reached the server).
    :ivar resent: a copy went out after another: the earlier one may still arrive, late.
    """

    __slots__ = ("resent", "sent")

    def __init__(self) -> None:
        self.sent = False
        self.resent = False

    def sending(self, resend: bool) -> None:
        self.resent = self.resent or resend or self.sent
        self.sent = True


class Settlement:
    """Settles one lock's calls whose outcome is unknown (see the module docstring)."""

    __slots__ = ("lock",)

    def __init__(self, lock: Settled) -> None:
        self.lock = lock

    # -- acquires ----------------------------------------------------------------------------

    def acquire_unknown(self, attempt: Attempt, work: asyncio.Future[Any]) -> None:
        """The caller of ``attempt`` will never see its outcome (``work``): a grant is undone,
        exactly that one, once the call is over."""
        self.later(attempt.owner, work, lambda: self.undo_if_granted(work, attempt))

    async def undo_if_granted(self, work: asyncio.Future[Any], attempt: Attempt) -> None:
        failure = work.exception()
        if isinstance(failure, NotSent):
            return
        owner = attempt.owner
        if attempt.resent:
            await self.void(owner, [attempt.request])  # a first copy may still arrive
        if failure is None and self.lock.grant_of(work.result(), attempt.lease_ms) is None:
            return  # the lock was busy: nothing was granted
        # Granted, or failed with an unknown outcome: undo exactly that request, if it landed.
        request = self.lock.services.owners.next_request()
        until = max(asyncio.get_running_loop().time() + attempt.lease, self.lease_end(owner))
        await self.retry_release(owner, request, attempt.request, until)

    def give_back(self, attempt: Attempt) -> None:
        """Undo exactly the grant ``attempt`` got, in the background (the owner's next call
        waits for it): nobody can count on it."""
        lock = self.lock
        services = lock.services
        request = services.owners.next_request()
        owner = attempt.owner
        until = max(asyncio.get_running_loop().time() + attempt.lease, self.lease_end(owner))
        services.holds.defer(
            lock.keys.lock, owner, self.retry_release(owner, request, attempt.request, until)
        )

    async def reconcile(self, attempt: Attempt, reply: list[Any], synced: int) -> list[Any] | None:
        """A grant checked against what the client knows, before it is recorded: the reply to
        record, or ``None`` when it re-entered a hold the client took for lost (dropped, so
        that the caller tries again).

        :raises LockSyncError: fewer replicas than ``sync_replicas`` confirmed it in time; it
            was undone.
        """
        lock = self.lock
        services = lock.services
        holds = services.holds
        owner = attempt.owner
        if services.sync is not None and synced < services.sync[0]:
            # Not on enough replicas in time: a failover could forget it.  Undo exactly this
            # grant (a settlement: the caller may be cancelled meanwhile), then say so.
            self.give_back(attempt)
            await holds.wait_pending(lock.keys.lock, owner)
            raise LockSyncError(
                f"{synced} of the {services.sync[0]} replica(s) asked for confirmed the grant of "
                f"{lock.name!r} within {services.sync[1]}s; it was undone"
            )
        count = int(reply[1])
        known = holds.get(lock.registry_key, owner)
        if known is not None:
            if (
                known.token == int(reply[0])
                and count <= known.count
                and (known.granted_at >= attempt.sent_at)
            ):
                # Another call of this owner recorded this very hold while this try was in
                # flight (a fair grant from the queue, which a try sent before the client knew
                # of it adopts): not a hold of this call's.  Its next try re-enters.
                return None
            return reply
        if count <= 1 and holds.lost_token(lock.registry_key, owner) != int(reply[0]):
            return reply
        # The server has more holds of this owner than the client knows of: a grant the client
        # never saw (a late copy of an earlier request, applied after its resend was answered),
        # or the very hold the client already took for lost (its deadlines run a little ahead
        # of the server's; a fair lock's try adopts such a hold, if it was a grant from the
        # queue, as one hold with its old token).  The unknown holds are dropped as a
        # settlement (a cancelled caller leaves none behind).
        if holds.lost_token(lock.registry_key, owner) == int(reply[0]):
            # Its token was handed out before: not a fresh grant.  Drop them all, retry.
            holds.defer(lock.keys.lock, owner, self.drop_holds(owner, count))
            await holds.wait_pending(lock.keys.lock, owner)
            return None
        logger.warning(
            "%s %r: the server had %d hold(s) of this owner the client never saw (a late "
            "copy of an earlier request); releasing them",
            lock.kind,
            lock.name,
            count - 1,
            extra=lock_extra(lock.kind, lock.name, owner),
        )
        holds.defer(lock.keys.lock, owner, self.drop_holds(owner, count - 1))
        return [reply[0], 1, reply[2]]  # this grant is the owner's one hold

    # -- voiding resent acquires -------------------------------------------------------------

    async def void(self, owner: str, requests: list[int]) -> None:
        """Void the owner's resent acquire ``requests``: late copies of them grant nothing once
        the owner does not hold the lock.  A resend voids itself in its own script
        (``mark_resends`` in ``Calls.run``), for the resend window; a hold may outlive that,
        so this runs again before the release that ends a hold whose acquires were resent,
        when such a hold is lost, and in the settlement of a resent call whose caller left.

        Without it, a copy arriving after another owner's release replaced the marker of the
        owner's own last release would grant a hold nobody knows of.  A failure is logged and
        the caller goes on: the lease still bounds such a hold.
        """
        lock = self.lock
        try:
            await lock.services.calls.run(*lock.void_call(owner, requests))
        except _FAILURES as exc:
            logger.warning(
                "could not void %d resent acquire(s) of %r: %r",
                len(requests),
                lock.name,
                exc,
                extra=lock_extra(lock.kind, lock.name, owner),
            )

    def void_lost(self, hold: Hold) -> None:
        """A hold whose acquires were resent was lost (its lease ran out, it was forced): no
        release will void them, so it is done now, in the background."""
        if hold.resent:
            voided, hold.resent = hold.resent, []
            self.lock.services.holds.defer(
                self.lock.keys.lock, hold.owner, self.void(hold.owner, voided)
            )

    # -- releases ----------------------------------------------------------------------------

    def release_unknown(
        self, owner: str, request: int, work: asyncio.Future[Any], copies: ReleaseCopies
    ) -> None:
        """The caller of a release will never see its outcome (``work``; ``copies``: what the
        call sent of it).

        Not kept as held from now on: the watchdog would renew a hold that may be gone, and
        the next acquire would silently re-enter it.  How long the hold may live is read
        first: untracked, its lease is no longer known.
        """
        until = self.lease_end(owner)
        self.untrack_one(owner)
        self.later(owner, work, lambda: self.release_outcome(work, owner, request, until, copies))

    async def release_outcome(
        self,
        work: asyncio.Future[Any],
        owner: str,
        request: int,
        until: float,
        copies: ReleaseCopies,
    ) -> None:
        """Settle a release with an unknown outcome: record it, or resend it until it lands
        (or the hold surely ended: ``until``, loop time)."""
        if work.exception() is None:
            lock = self.lock
            self.released_copies(owner, request, copies)
            remaining = holds_left(work.result())
            lock.services.holds.released(lock.registry_key, owner, remaining)
            return
        await self.retry_release(owner, request, None, until, copies)
        # The first copy may have deleted the lock, and with it the mark of a waiter refused
        # meanwhile, whose wake-up it owed (a release by a bare command publishes only once it
        # reads its reply): the resend finds nothing to say so.  A spare wake-up costs a try.
        await self.lock.wake_others()

    def released_copies(self, owner: str, request: int, copies: ReleaseCopies) -> None:
        """The owner's release ``request`` was answered (or given up on).  If it was resent, an
        earlier copy may still arrive, after the owner acquired again, and must not release
        that newer hold: the client keeps its id for the resend window, and the owner's
        acquires of the lock carry it meanwhile (``Holds.resent_release``).  Only once it was
        answered: a concurrent acquire of the same owner (an explicit owner shared by two
        tasks) that carried it before the release applied would have it refused."""
        if copies.resent:
            services = self.lock.services
            window = services.resend_window_ms / 1000
            services.holds.resent_release(self.lock.keys.lock, owner, request, window)

    def check_count(self, owner: str, expected_left: int | None, remaining: int | None) -> None:
        """A release left more holds on the server than the client knew of: drop the extra.

        Left by a background release that gave up (logged as a warning), else a bug signal
        (logged as an error).  Either way the holds nobody knows of are released in the
        background, so that neither the watchdog nor a later acquire ever treats them as the
        owner's.
        """
        if remaining is None or remaining <= (expected_left or 0):
            return
        lock = self.lock
        holds = lock.services.holds
        extra = remaining - (expected_left or 0)
        abandoned = holds.was_abandoned(lock.keys.lock, owner)
        logger.log(
            logging.WARNING if abandoned else logging.ERROR,
            "lock %r: the server has %d hold(s) of this owner that the client did not know "
            "of%s; releasing them",
            lock.name,
            extra,
            " (left by a release that gave up)" if abandoned else "",
            extra=lock_extra(lock.kind, lock.name, owner),
        )
        holds.defer(lock.keys.lock, owner, self.drop_holds(owner, extra))

    async def drop_all(self, owner: str) -> bool:
        """Release every hold of ``owner`` on the server (holds its client did not know of);
        ``True`` once none is left, ``False`` if a release failed."""
        lock = self.lock
        services = lock.services
        while True:
            request = services.owners.next_request()
            copies = ReleaseCopies()
            call = lock.release_call(owner, request, None)
            try:
                reply = await services.calls.run(*call, on_send=copies.sending)
            except _FAILURES as exc:
                if isinstance(exc, ResponseError):
                    lock.release_unapplied(call)
                logger.warning(
                    "could not release %r in the background: %r",
                    lock.name,
                    exc,
                    extra=lock_extra(lock.kind, lock.name, owner),
                )
                self.released_copies(owner, request, copies)
                return False
            finally:
                lock.release_settled(call)
            self.released_copies(owner, request, copies)
            check_applied(lock, call, reply, copies)
            if not holds_left(reply):
                return True

    async def drop_holds(self, owner: str, count: int) -> None:
        services = self.lock.services
        for _ in range(count):
            request = services.owners.next_request()
            until = asyncio.get_running_loop().time() + services.watchdog_timeout
            await self.retry_release(owner, request, None, until)

    async def retry_release(
        self,
        owner: str,
        request: int,
        undo: int | None,
        until: float,
        copies: ReleaseCopies | None = None,
    ) -> None:
        """Send one (idempotent) release until it lands, the lease surely ran out, or close
        (``copies``: what was sent of it before; see :meth:`released_copies`).

        Giving up is safe only because every hold it may concern has a lease: the server ends
        it by itself, by ``until`` (loop time) as the client counts.  The server may count from
        later (a call it applied late, after a stall), hence the margin; a hold that outlives
        even that is recorded as abandoned, so that meeting it later is not taken for a bug.
        """
        lock = self.lock
        services = lock.services
        copies = ReleaseCopies() if copies is None else copies
        script, keys, args = lock.release_call(owner, request, undo)
        if undo is not None:
            # An undo that finds its acquire unapplied writes a marker: for the resend window.
            args = (*args, services.resend_window_ms)
        try:
            reply = await until_it_lands(
                lambda: services.calls.run(script, keys, args, on_send=copies.sending),
                until + _SETTLE_MARGIN,
                services,
            )
        except _FAILURES as exc:
            if isinstance(exc, ResponseError):
                lock.release_unapplied((script, keys, args))
            logger.warning(
                "gave up releasing %r in the background: %r",
                lock.name,
                exc,
                extra=lock_extra(lock.kind, lock.name, owner),
            )
            services.holds.abandoned(lock.keys.lock, owner)
            self.released_copies(owner, request, copies)  # copies may still land
            return
        finally:
            lock.release_settled((script, keys, args))
        self.released_copies(owner, request, copies)
        check_applied(lock, (script, keys, args), reply, copies)
        services.holds.released(lock.registry_key, owner, holds_left(reply))

    # -- the pieces --------------------------------------------------------------------------

    def later(
        self,
        owner: str,
        work: asyncio.Future[Any],
        settle: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        """Once the call ``work`` whose outcome its caller never saw is over, ``settle()`` it.

        Registered at once, so the owner's next acquire or release on this name waits for it
        (in any mode: settlements are keyed by the lock, not by the registry key).
        """

        async def when_done() -> None:
            await asyncio.wait([work])
            if not work.cancelled():  # cancelled: the client is closing
                await settle()

        self.lock.services.holds.defer(self.lock.keys.lock, owner, when_done())

    def untrack_one(self, owner: str) -> None:
        """Stop counting one hold whose release has an unknown outcome."""
        holds = self.lock.services.holds
        hold = holds.get(self.lock.registry_key, owner)
        if hold is not None:
            if hold.count > 1:
                hold.count -= 1
            else:
                holds.forget(hold)

    def lease_end(self, owner: str) -> float:
        """Until when (loop time) a settlement keeps resending: the owner's hold's lease end as
        the client knows it, and no earlier than a watchdog lease from now."""
        services = self.lock.services
        hold = services.holds.get(self.lock.registry_key, owner)
        until = asyncio.get_running_loop().time() + services.watchdog_timeout
        return until if hold is None else max(until, hold.expires_at)


def holds_left(reply: Any) -> int | None:
    """A release script reply: holds left, or ``None`` when the owner did not hold the lock
    (the message of a grant the release made, :func:`grant_message`, stands for 0)."""
    if reply is None:
        return None
    return 0 if isinstance(reply, (bytes, str)) else int(reply)


def grant_message(reply: Any) -> bytes | None:
    """The message of the grant a release script's ``reply`` says it made (the plain lock's
    ``lock/release.lua``: ``=<token> <member>``, a string), or ``None``."""
    if isinstance(reply, str):
        return reply.encode()
    return reply if isinstance(reply, bytes) else None


def check_applied(lock: Settled, call: Call, reply: Any, copies: ReleaseCopies) -> None:
    """Tell ``lock`` of a release ``call`` answered ``nil`` by its only copy, which released
    nothing and so changed nothing (a resend's ``nil`` may follow a first copy that ran)."""
    if reply is None and not copies.resent:
        lock.release_unapplied(call)
