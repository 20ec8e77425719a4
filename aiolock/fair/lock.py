"""``AsyncFairLock``: first come, first served across every client, with the queue in Redis.

A kind on the shared engine (:mod:`aiolock._core.kind`) with the scripts in ``scripts/fair/``: the
lock hash of the plain lock, plus a queue of waiting owners (a list, first in line first) and
their deadlines on the server's clock.  A try that does not get the lock takes (or keeps) the
owner's place and sets its deadline; a release grants the lock to exactly the next waiter
itself, and tells it with one message on the channel of that waiter's client, naming it and
carrying the grant (:mod:`aiolock.fair.entry`, :class:`~aiolock.fair.waiting.NamedWait`), so
there is no herd however many clients wait, no channel per waiting task, and the waiter starts
with no further call.

**The hand-off by message.**  The grant's lease is counted on the waiter's clock from a safe
lower bound of the moment the server made it (:class:`~aiolock._core.clock.ServerClock`,
sampled by every queued try, whose reply carries the server's time), never from the message's
arrival.  Its lease is the one the waiter's last try asked for, at most ``fair_wait_timeout``
(a grant to a waiter that vanished blocks the lock no longer than a vanished head did); a
``lease=None`` hold so granted has its first renewal brought forward.  A grant the waiter
cannot count on (no clock sample, too little lease left, a capped explicit lease, an owner
its client holds already) is taken by a try instead: the server marks grants from the queue
(``'q:<owner>'``), and a try of an owner its client knows no hold of (``fresh``) adopts such a grant
as its one hold, which also covers a lost message and a try in flight when the release
granted.  A waiter that leaves without the lock (timeout, cancellation) withdraws with
``fresh`` too, which takes back a grant its client never took.

**Paying for what the client knows.**  The first try of an owner's only waiting call says so
(``first``: the server then reads no lock hash and looks for no member of the owner), a try
with a recent sample of the server's clock sends its lower bound of it (``t:<ms>``: no
``TIME``), and the owner's last release with no fault around it is ``fair/last.lua``, one
``HDEL`` of the hold's fields and the hand-over, stamped the same way (see
``docs/internals.md``).

Waiters that give up withdraw from the queue at once (a ``withdraw`` script, settled in the
background like any call whose caller has gone).  A parked waiter does not try again: its
client keeps its place and looks at the lock for it (:mod:`aiolock.fair.watch`), and every
try of a waiting call first waits for its turn (:class:`~aiolock.fair.waiting.Turns`: a bound
on the tries in flight per client and slot), on a bare future: thousands of waiters arrive at
once.

A parked waiter is bounded by the lease left of the hold in front of it, then: when it runs out
its client's keep-alive hands the lock over; and a grant from the queue tells the next in line
with a bound message (``+<ms> <owner>``, :meth:`~aiolock.fair.entry.NamedEntry.bound_named`)
when a lease shorter than the timeout ends.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from .. import _scripts
from .._core.holds import Hold
from .._core.hooks import Call, release_args
from .._core.keys import LockKeys, alive_of
from .._core.kind import LockKind
from .._core.services import Services
from .._core.settlement import Attempt
from .._core.waiting import MessageGrant, WaitStrategy
from .alive import AliveKey
from .entry import Grant
from .queue import FairKeys
from .waiting import NamedWait, Turns
from .watch import QueueWatch

__all__ = ["AsyncFairLock"]

_TRIES_IN_FLIGHT = 16
"""Tries of the fair locks of one slot (one server) a client's waiting calls have in flight
at once (see :class:`~aiolock.fair.waiting.Turns`)."""


class AsyncFairLock(LockKind):
    """A reentrant lock granted in the order waiters first asked, across all clients.

    Create it with :meth:`aiolock.Client.fair_lock`; it offers every call of
    :class:`~aiolock.AsyncRLock` with the same semantics.  Choose it when waiters in many
    processes contend for one lock, or when the order matters: its release grants the lock to
    the next waiter and tells that waiter's client in one message, where the plain lock's
    names one waiting client, whose waiter then tries (and a newcomer may take it first).

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
        alive = alive_of(services.key_prefix, base.lock if services.cluster else None)
        return FairKeys(
            lock=base.lock,
            meta=base.meta,
            fence=base.fence,
            waiting=base.waiting,
            channel=wake_prefix + services.owners.client_id,
            queue=f"{base.lock}:ql",
            wake_prefix=wake_prefix,
            alive=alive,
        )

    def _script_keys(self) -> tuple[str, ...]:
        keys = self._keys
        assert isinstance(keys, FairKeys)
        return keys.script_keys()

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        wait_timeout_ms = round(self._services.fair_wait_timeout * 1000)
        watch = self._watch()
        late = self._late_args(owner)
        fresh = self._fresh(owner)
        member = watch.member(owner)
        # An explicit owner may have a second call whose try overtakes this one on another
        # connection: only a task's (one call at a time) may say it has nothing there.
        first = watch.first_try(owner) and self._explicit_owner is None
        if first and fresh and not late and not self._left_behind(owner):
            fresh = ("fresh", "first")
        elif member:
            fresh = (*fresh, f"m:{member}")  # where its place is: no search
        args: tuple[Any, ...] = (lease_ms, owner, request, wait_timeout_ms, *late, *fresh)
        if owner in watch.single_tries:
            args = (*args, "once")
        server_ms = watch.server_ms()
        if server_ms is not None:
            # Its deadline from the client's lower bound of the server's time: no TIME.
            args = (*args, f"t:{server_ms}")
        return _scripts.FAIR_ACQUIRE, self._script_keys(), args

    def _fresh(self, owner: str) -> tuple[str, ...]:
        """``fresh`` when the client knows no hold of ``owner`` on this lock: the server may
        then count a grant from the queue it marked as this call's (see the module doc)."""
        return ("fresh",) if self._services.holds.get(self._registry_key, owner) is None else ()

    @contextmanager
    def _single_try(self, owner: str) -> Iterator[None]:
        watch = self._watch()  # kept alive by this frame, with its record of the call
        single = watch.single_tries
        single[owner] = single.get(owner, 0) + 1
        watch.begin(owner)
        try:
            yield
        finally:
            watch.end(owner)
            if single[owner] == 1:
                del single[owner]
            else:
                single[owner] -= 1

    def _refusal_pause(self, attempt: Attempt, reply: Any) -> float:
        """A queued try answers ``'<pause ms> <server time ms> <member>'``: the pause, a sample
        of the server's clock (``-`` when the try sent its bound of it) and the owner's place
        in the queue (a late copy's refusal answers the pause alone: it queued nothing, and
        its caller, if any, tries again after the pause).

        A queued waiter does not try again when the lease it met runs out: its client's
        keep-alive looks at the lock then, once for all its waiters, and hands it over."""
        if isinstance(reply, bytes):
            reply = reply.decode()
        pause, _, rest = str(reply).partition(" ")
        seconds = super()._refusal_pause(attempt, int(pause))
        if not rest:
            return seconds
        server_ms, _, member = rest.partition(" ")
        watch = self._watch()
        watch.placed(attempt.owner, member)
        now = asyncio.get_running_loop().time()
        if server_ms != "-":  # '-': the try sent its lower bound of the server's time
            watch.clock.sample(attempt.sent_at, int(server_ms), now)
        watch.expect(now + seconds)
        return math.inf

    def _accept(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: MessageGrant,
    ) -> Hold | None:
        """Record a grant from the queue its message brought, counting its lease from a lower
        bound of the moment the server made it; ``None`` when it cannot be counted on (the
        wait loop then tries, which adopts it: see the module docstring)."""
        assert isinstance(grant, Grant)
        services = self._services
        if services.holds.get(self._registry_key, owner) is not None:
            return None  # an explicit owner another task holds with: a try re-enters
        now = asyncio.get_running_loop().time()
        granted_at = self._watch().clock.lower_bound(grant.server_ms, now)
        if granted_at is None:
            return None
        # Capped at the wait timeout: see Acquiring.record_message_grant.
        return self.record_message_grant(owner, task, lease, started, grant, granted_at=granted_at)

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        args = release_args(owner, request, undo)
        return _scripts.FAIR_RELEASE, self._script_keys(), args

    def _last_release_script(self, hold: Hold) -> Call | None:
        """The owner's last release with no fault around it (``fair/last.lua``): its hold's
        fields end in one ``HDEL`` and the lock is granted to the next waiter, stamped with
        this client's lower bound of the server's time when it has one (no ``TIME``)."""
        watch = self._services.peek_name_state("fair-watch", self.name)
        stamp = watch.server_ms() if isinstance(watch, QueueWatch) else None
        args = (hold.owner, "-" if stamp is None else stamp)
        return _scripts.FAIR_LAST, self._script_keys(), args

    def _force_call(self) -> Call:
        return _scripts.FAIR_FORCE, self._script_keys(), ()

    def _watch(self) -> QueueWatch:
        services = self._services
        keys = self._keys
        assert isinstance(keys, FairKeys)

        def build() -> QueueWatch:
            alive = services.name_state(
                "fair-alive", keys.alive, lambda: AliveKey(services, keys.alive, keys.fence)
            )
            # Per slot, as the alive key: a slow node must not hold up the others' tries.
            turns = services.name_state("fair-turns", keys.alive, lambda: Turns(_TRIES_IN_FLIGHT))
            return QueueWatch(keys, alive, turns)

        return services.name_state("fair-watch", self.name, build)

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        return NamedWait(self._services, self._keys.channel, self._counters, owner, self._watch())

    def withdraw_call(self, owner: str) -> Call | None:
        # With fresh, it also takes back a grant from the queue its client never took; with
        # the member its last try left, it finds its place without a search.  A call whose
        # tries were all answered, the last taking no place (once), has nothing to withdraw.
        member = self._watch().member(owner)
        if member == "":
            return None
        known = () if member is None else (f"m:{member}",)
        return _scripts.FAIR_WITHDRAW, self._script_keys(), (owner, *self._fresh(owner), *known)

    def _withdraw_lost(self, owner: str) -> None:
        self._services.holds.abandoned(self._keys.lock, owner, "withdraw")

    def _left_behind(self, owner: str) -> bool:
        """Whether a withdraw of ``owner`` gave up lately, so that its place may still be in
        the queue: the next try looks for it instead of pushing a second one (the record is
        used up)."""
        return self._services.holds.was_abandoned(self._keys.lock, owner, "withdraw")
