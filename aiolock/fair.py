"""``AsyncFairLock``: first come, first served across every client, with the queue in Redis.

A kind on the shared engine (:mod:`aiolock._core.kind`) with the scripts in ``scripts/fair/``: the
lock hash of the plain lock, plus a queue of waiting owners (a list, first in line first) and
their deadlines on the server's clock.  A try that does not get the lock takes (or keeps) the
owner's place and sets its deadline; a release grants the lock to exactly the next waiter
itself, and tells it with one message on the channel of that waiter's client, naming it and
carrying the grant (:class:`~aiolock._core.waiting.NamedWait`), so there is no herd however
many clients wait, no channel per waiting task, and the waiter starts with no further call.

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
background like any call whose caller has gone).  A parked waiter does not try again, neither to
keep its place nor when the lease it met runs out: its place is kept by its client, one alive
key per client (and Cluster slot), set for ``fair_wait_timeout`` every half of it by one call
(``keep.lua``, :class:`AliveKey`) while the client has parked waiters, whatever their number
and locks; a waiter past its try's deadline whose client's key is gone has vanished, and is
dropped once it is next.  The same call looks at the locks with waiters of the client when a
lease it knows of runs out (expiry publishes nothing) and at least once a timeout, and hands a
free lock over to its queue's first live waiter (:class:`KeepAlive`).  Every try of a waiting
call first waits for its turn (:class:`Turns`: a bound on the tries in flight per client and
slot), on a bare future: thousands of waiters arrive at once.

A parked waiter is bounded by the lease left of the hold in front of it, then: when it runs out
its client's keep-alive hands the lock over; and a grant from the queue tells the next in line
with a bound message (``+<ms> <owner>``, :meth:`~aiolock._redis.pubsub.NamedEntry.bound_named`)
when a lease shorter than the timeout ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.exceptions import RedisError

from . import _scripts
from ._core.clock import ServerClock
from ._core.holds import Hold
from ._core.hooks import Call, release_args
from ._core.keys import LockKeys, alive_of
from ._core.kind import LockKind
from ._core.services import Services
from ._core.settlement import Attempt
from ._core.waiting import NamedWait, Waiting
from ._redis.pubsub import Grant, NamedEntry
from ._redis.tasks import supervise

__all__ = ["AliveKey", "AsyncFairLock", "KeepAlive", "Turns"]

logger = logging.getLogger("aiolock.lock")

_TRIES_IN_FLIGHT = 16
"""Tries of the fair locks of one slot (one server) a client's waiting calls have in flight
at once (see :class:`Turns`)."""

_SHORTEST_GRANT = 0.05
"""The least lease (s), as the client counts it, a grant by message must have left to be taken
without a try (and at least a third of its lease)."""


_RESAMPLE = 10.0
"""How old (s) the sample of the server's clock may be for a try to send its lower bound of
the server's time instead of having the script read the clock (and so sample it again)."""


@dataclass(frozen=True, slots=True)
class FairKeys(LockKeys):
    """The plain lock's keys, plus the queue: ``queue`` (a list of waiters, each with what a
    grant from the queue needs and the server time in ms until which the try that queued it
    keeps it in line: ``scripts/fair/_queue.lua``), the wake-up channels
    ``<wake_prefix><client id>`` and the alive keys ``<alive><client id>`` of the lock's
    slot; ``channel`` is this client's."""

    queue: str
    wake_prefix: str
    alive: str

    def script_keys(self) -> tuple[str, ...]:
        return (self.lock, self.meta, self.queue, self.wake_prefix, self.fence, self.alive)


class KeepAlive:
    """This client's part in one fair lock's queue: its parked waiters, and when to look.

    The waiters' places are kept by the client's :class:`AliveKey` of the lock's slot, which
    also looks at the lock, for all the client's fair locks of the slot in one call: when a
    lease this client knows of runs out (expiry publishes nothing; ``due``), and at least once
    a wait timeout (a grant to a waiter that vanished, a head only woken).  A look hands the
    lock over if it is free; an owner the server no longer has in the queue is woken to try
    again.  Shared by the waiting calls of the name (through the client's name cache).
    """

    __slots__ = (
        "__weakref__",
        "_alive",
        "_calls",
        "_entry",
        "_parked",
        "_turns",
        "clock",
        "count_at",
        "due",
        "keys",
        "look_at",
        "once",
    )

    def __init__(self, keys: FairKeys, alive: AliveKey, turns: Turns) -> None:
        self.keys = (keys.lock, keys.queue, keys.wake_prefix)
        self._alive = alive
        self._turns = turns
        # The server's clock against the loop's, from the name's queued tries: per name, so
        # that on a Cluster it is the clock of the node the name lives on.
        self.clock = ServerClock()
        # Owners making one attempt that will not wait (try_lock(wait=0), a composite's part),
        # with how many such calls each has in flight: their tries ask for no grant from the
        # queue (the withdraw that follows a refusal would have to take it back).
        self.once: dict[str, int] = {}
        # The acquire calls of each owner in progress: -1 for one that has not tried yet (its
        # first try tells the server the owner has nothing there: no place to look for), its
        # member of the queue for one that took a place (its retries and its withdraw name
        # it: no search), else how many there are.
        self._calls: dict[str, int | str] = {}
        self._parked = 0  # waiting calls that parked, on _entry (whose names they are)
        self._entry: NamedEntry | None = None
        self.due = math.inf  # (loop time) the lock may be free then with nobody told
        self.look_at = 0.0  # the next look at the lock, at the latest
        self.count_at = 0.0  # the next look that also checks the queue has our owners

    def begin(self, owner: str) -> None:
        calls = self._calls.get(owner)
        self._calls[owner] = -1 if calls is None else _count(calls) + 1

    def end(self, owner: str) -> None:
        calls = _count(self._calls.pop(owner, 1)) - 1
        if calls:
            self._calls[owner] = calls

    def first_try(self, owner: str) -> bool:
        """Whether this try of ``owner`` is the first of its only waiting call, so that the
        owner has nothing on the server (its earlier calls' withdraws were settled first; one
        that gave up is remembered: see ``AsyncFairLock._left_behind``).
        Not for a call that will not wait (``once``): it reads the lock hash, and so adopts a
        grant from the queue its owner may have had since a withdraw that never landed."""
        if self._calls.get(owner) != -1:
            return False
        self._calls[owner] = 1
        return owner not in self.once

    def server_ms(self) -> int | None:
        """This client's lower bound of the server's time now (ms), from a sample of its clock
        younger than ``_RESAMPLE`` (ageing covers the clocks' rates, not a server changed
        since), or ``None``: the script then reads the clock."""
        now = asyncio.get_running_loop().time()
        if self.clock.age(now) >= _RESAMPLE:
            return None
        return self.clock.server_ms_at_least(now)

    def placed(self, owner: str, member: str) -> None:
        """A try of ``owner``'s only call took (or kept) this place in the queue (``""``:
        it took none)."""
        if _count(self._calls.get(owner, 2)) == 1:
            self._calls[owner] = member

    def member(self, owner: str) -> str | None:
        """The place of ``owner``'s only call in the queue, as its last try left it (``""``:
        none), or ``None`` when the client does not know it."""
        calls = self._calls.get(owner)
        return calls if isinstance(calls, str) else None

    def add(self, entry: NamedEntry) -> None:
        self._parked += 1
        if self._parked == 1:
            self._entry = entry
            self._alive.join(self)

    def discard(self) -> None:
        self._parked -= 1
        if not self._parked:
            self._entry = None
            self._alive.leave(self)

    def turn(self) -> asyncio.Future[None] | None:
        """``None`` if a try may start now (it took a turn), else a future done when it may
        (see :meth:`Turns.take`)."""
        return self._turns.take()

    def tried(self) -> None:
        self._turns.give_back()

    def expect(self, at: float) -> None:
        """The lock may be free at loop time ``at`` with nobody told (a lease that runs out)."""
        if at < self.due:
            self.due = at
            if self._parked:
                self._alive.schedule()

    def owners(self) -> list[str]:
        return [] if self._entry is None else self._entry.names()

    def wake(self, owners: list[bytes | str] | None = None) -> None:
        """Wake ``owners`` (all waiting, for ``None``) to try again: they lost their places."""
        entry = self._entry
        if entry is None:
            return
        for name in entry.names() if owners is None else owners:
            entry.wake_named(name.decode() if isinstance(name, bytes) else name)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _count(calls: int | str) -> int:
    """How many calls a :attr:`KeepAlive._calls` value stands for."""
    return 1 if isinstance(calls, str) or calls == -1 else calls


class Turns:
    """Bounds the tries a client's waiting calls have in flight on the fair locks of one slot.

    Thousands of waiters arrive at once, and each makes one try to take its place: beyond the
    bound, a call would wait for a connection with all its call frames; here it waits for its
    turn on a bare future, in order (see :meth:`~aiolock._core.waiting.NamedWait.turn`).
    """

    __slots__ = ("__weakref__", "_free", "_queued")

    def __init__(self, bound: int) -> None:
        self._free = bound
        self._queued: deque[asyncio.Future[None]] = deque()

    def take(self) -> asyncio.Future[None] | None:
        """``None`` if a try may start now (it took a turn), else a future done when it may."""
        if self._free:
            self._free -= 1
            return None
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queued.append(turn)
        return turn

    def give_back(self) -> None:
        """A try ended: hand its turn to the next one queued (a cancelled one has left)."""
        while self._queued:
            turn = self._queued.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1


class AliveKey:
    """Keeps all the fair waiters of this client in one Cluster slot (one server) in line.

    While any of them is parked, one call (``keep.lua``) every half of ``fair_wait_timeout``
    sets the client's alive key for the timeout: it keeps every waiter of the client live in
    every queue of the slot, so a parked waiter costs the server nothing.  The same call looks
    at the locks that are due (:class:`KeepAlive`), and once every other timeout or so checks
    that their queues still have this client's owners and re-arms their expiry.  If the key
    was gone when the call set it, the client stalled past the timeout and its waiters may
    have been dropped: all are woken to try again.  When the last leaves, the key is deleted
    (a fault-free use leaves no key behind).  A failed call is logged, and the next comes a
    sixth of the timeout later.  The calls are made by one loop (:meth:`_keep`), supervised
    (:func:`~aiolock._redis.tasks.supervise`): it runs while there is something to keep.
    """

    __slots__ = (
        "__weakref__",
        "_fence",
        "_members",
        "_prefix",
        "_retry_at",
        "_services",
        "_task",
        "_tick_at",
        "_wake",
        "_wake_at",
        "_written",
    )

    def __init__(self, services: Services, prefix: str, fence: str) -> None:
        self._services = services
        self._prefix = prefix
        self._fence = fence
        self._members: dict[KeepAlive, None] = {}  # the locks with parked waiters, in order
        self._task: asyncio.Task[None] | None = None  # the loop, while it runs
        # Done to have the loop, sleeping until loop time _wake_at, look again sooner.
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = math.inf
        self._tick_at = math.inf  # the next refresh of the alive key (loop time)
        self._retry_at = 0.0  # after a failed call: no call before then
        self._written = False  # the key should exist: set, and not deleted since

    def join(self, member: KeepAlive) -> None:
        now = asyncio.get_running_loop().time()
        timeout = self._services.fair_wait_timeout
        # Its try has just looked at the lock, and its place is kept by the try's deadline
        # for a whole timeout: the alive key must be set within it.
        member.look_at = now + timeout
        member.count_at = now + 2 * timeout
        if not self._members:
            self._tick_at = now + timeout / 2
        self._members[member] = None
        self.schedule()

    def leave(self, member: KeepAlive) -> None:
        self._members.pop(member, None)
        if not self._members:
            self.schedule()

    def schedule(self) -> None:
        """The next call (or the key's deletion) may be due sooner: start the loop, or have
        it look again if it sleeps past that (a call in flight: the loop looks after it)."""
        task = self._task
        if task is None or task.done():
            if self._members or self._written:
                self._task = supervise("aiolock-fair-keepalive", self._keep)
            return
        wake = self._wake
        if wake is None or wake.done():
            return  # a call in flight, or the loop is about to look anyway
        if not self._members or self._next_at() < self._wake_at:
            wake.set_result(None)

    def _next_at(self) -> float:
        """When the next call is due (loop time), while there are members."""
        # After a failed call, nothing before the retry it set (a due in the past stays so).
        return max(min(self._tick_at, *(member.due for member in self._members)), self._retry_at)

    async def _keep(self) -> None:
        """The loop: each call when it is due, then the key's deletion once nobody waits."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._members:
                if not self._written:
                    return
                # Also as the client closes: its last calls still go out.
                await self._run([], gone=True)
                continue
            if self._services.closed:
                return
            at = self._next_at()
            if at > loop.time():
                await self._sleep_until(at)
                continue
            now = loop.time()
            # Looks due within a quarter of the timeout come now, with the refresh: one call
            # (the next refresh comes half a timeout later; a look is late by a quarter at most).
            soon = now + self._services.fair_wait_timeout / 4
            due = [m for m in self._members if m.due <= now + 0.001 or m.look_at <= soon]
            await self._run(due, gone=False)

    async def _sleep_until(self, at: float) -> None:
        """Sleep until loop time ``at``, or until :meth:`schedule` wakes the loop sooner."""
        loop = asyncio.get_running_loop()
        wake = self._wake = loop.create_future()
        self._wake_at = at
        timer = loop.call_at(at, _wake, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake, self._wake_at = None, math.inf

    async def _run(self, members: list[KeepAlive], *, gone: bool) -> None:
        """One call: set the alive key and look at ``members``, or delete the key (``gone``)."""
        services = self._services
        loop = asyncio.get_running_loop()
        timeout = services.fair_wait_timeout
        sent_at = loop.time()
        soon = sent_at + timeout / 4
        counted = [member.count_at <= soon for member in members]
        keys = [self._prefix, self._fence]
        args: list[Any] = [
            round(timeout * 1000),
            services.owners.client_id,
            "1" if self._written else "0",
            "gone" if gone else "-",
        ]
        for member, count in zip(members, counted, strict=True):
            keys += member.keys
            if count:
                owners = member.owners()
                args += [len(owners), *owners]
            else:
                args.append(-1)
        # After a failure the next call comes soon: the key lasts one timeout.
        self._tick_at = self._retry_at = sent_at + timeout / 6
        try:
            if gone:
                self._written = False  # a failed deletion leaves it to expire
            reply = await services.calls.run(_scripts.FAIR_KEEP, tuple(keys), tuple(args))
            if not gone:
                self._written = True
                self._kept(members, counted, reply)
        except (RedisError, OSError, RuntimeError) as exc:  # RuntimeError: the client closed
            if not services.closed:
                logger.warning("keeping fair waiters in line failed: %r", exc)

    def _kept(self, members: list[KeepAlive], counted: list[bool], reply: Any) -> None:
        lapsed, dues, missing = reply
        now = asyncio.get_running_loop().time()
        timeout = self._services.fair_wait_timeout
        self._tick_at, self._retry_at = now + timeout / 2, 0.0
        for member, count, due_ms, lost in zip(members, counted, dues, missing, strict=True):
            member.look_at = now + timeout
            if count:
                member.count_at = now + 2 * timeout
            # Counted from the reply: late by one round trip at most, never early.
            member.due = now + int(due_ms) / 1000 if due_ms else math.inf
            member.wake(lost)
        if lapsed:
            for member in list(self._members):
                member.wake()


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
        alive = alive_of(services.key_prefix, base.lock if services.cluster else None)
        return FairKeys(
            lock=base.lock,
            meta=base.meta,
            fence=base.fence,
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
        wait_ms = round(self._services.fair_wait_timeout * 1000)
        keeper = self._keeper()
        late = self._late_args(owner)
        fresh = self._fresh(owner)
        member = keeper.member(owner)
        # An explicit owner may have a second call whose try overtakes this one on another
        # connection: only a task's (one call at a time) may say it has nothing there.
        first = keeper.first_try(owner) and self._explicit_owner is None
        if first and fresh and not late and not self._left_behind(owner):
            fresh = ("fresh", "first")
        elif member:
            fresh = (*fresh, f"m:{member}")  # where its place is: no search
        args: tuple[Any, ...] = (lease_ms, owner, request, wait_ms, *late, *fresh)
        if owner in keeper.once:
            args = (*args, "once")
        server_ms = keeper.server_ms()
        if server_ms is not None:
            # Its deadline from the client's lower bound of the server's time: no TIME.
            args = (*args, f"t:{server_ms}")
        return _scripts.FAIR_ACQUIRE, self._script_keys(), args

    def _fresh(self, owner: str) -> tuple[str, ...]:
        """``fresh`` when the client knows no hold of ``owner`` on this lock: the server may
        then count a grant from the queue it marked as this call's (see the module doc)."""
        return ("fresh",) if self._services.holds.get(self._hold_key, owner) is None else ()

    @contextmanager
    def _single_try(self, owner: str) -> Iterator[None]:
        keeper = self._keeper()  # kept alive by this frame, with its record of the call
        once = keeper.once
        once[owner] = once.get(owner, 0) + 1
        keeper.begin(owner)
        try:
            yield
        finally:
            keeper.end(owner)
            if once[owner] == 1:
                del once[owner]
            else:
                once[owner] -= 1

    def _busy(self, attempt: Attempt, reply: Any) -> float:
        """A queued try answers ``'<pause ms> <server time ms> <member>'``: the pause, a sample
        of the server's clock (``-`` when the try sent its bound of it) and the owner's place
        in the queue (a late copy's refusal answers the pause alone: it queued nothing, and
        its caller, if any, tries again after the pause).

        A queued waiter does not try again when the lease it met runs out: its client's
        keep-alive looks at the lock then, once for all its waiters, and hands it over."""
        if isinstance(reply, bytes):
            reply = reply.decode()
        pause, _, rest = str(reply).partition(" ")
        seconds = super()._busy(attempt, int(pause))
        if not rest:
            return seconds
        server_ms, _, member = rest.partition(" ")
        keeper = self._keeper()
        keeper.placed(attempt.owner, member)
        now = asyncio.get_running_loop().time()
        if server_ms != "-":  # '-': the try sent its lower bound of the server's time
            keeper.clock.sample(attempt.sent_at, int(server_ms), now)
        keeper.expect(now + seconds)
        return math.inf

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

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        args = release_args(owner, request, undo)
        return _scripts.FAIR_RELEASE, self._script_keys(), args

    def _last_release_script(self, hold: Hold) -> Call | None:
        """The owner's last release with no fault around it (``fair/last.lua``): its hold's
        fields end in one ``HDEL`` and the lock is granted to the next waiter, stamped with
        this client's lower bound of the server's time when it has one (no ``TIME``)."""
        keeper = self._services.peek_name_state("fair-keep", self.name)
        stamp = keeper.server_ms() if isinstance(keeper, KeepAlive) else None
        args = (hold.owner, "-" if stamp is None else stamp)
        return _scripts.FAIR_LAST, self._script_keys(), args

    def _force_call(self) -> Call:
        return _scripts.FAIR_FORCE, self._script_keys(), ()

    def _keeper(self) -> KeepAlive:
        services = self._services
        keys = self._keys
        assert isinstance(keys, FairKeys)

        def build() -> KeepAlive:
            alive = services.name_state(
                "fair-alive", keys.alive, lambda: AliveKey(services, keys.alive, keys.fence)
            )
            # Per slot, as the alive key: a slow node must not hold up the others' tries.
            turns = services.name_state("fair-turns", keys.alive, lambda: Turns(_TRIES_IN_FLIGHT))
            return KeepAlive(keys, alive, turns)

        return services.name_state("fair-keep", self.name, build)

    def _waiting(self, owner: str) -> Waiting:
        return NamedWait(self._services, self._keys.channel, self._counters, owner, self._keeper())

    def withdraw_call(self, owner: str) -> Call | None:
        # With fresh, it also takes back a grant from the queue its client never took; with
        # the member its last try left, it finds its place without a search.  A call whose
        # tries were all answered, the last taking no place (once), has nothing to withdraw.
        member = self._keeper().member(owner)
        if member == "":
            return None
        known = () if member is None else (f"m:{member}",)
        return _scripts.FAIR_WITHDRAW, self._script_keys(), (owner, *self._fresh(owner), *known)

    def _withdraw_lost(self, owner: str) -> None:
        keys = self._keys
        assert isinstance(keys, FairKeys)
        self._services.holds.abandoned(keys.queue, owner)

    def _left_behind(self, owner: str) -> bool:
        """Whether a withdraw of ``owner`` gave up lately, so that its place may still be in
        the queue: the next try looks for it instead of pushing a second one (the record is
        used up)."""
        keys = self._keys
        assert isinstance(keys, FairKeys)
        return self._services.holds.was_abandoned(keys.queue, owner)
