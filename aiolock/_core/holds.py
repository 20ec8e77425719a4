"""What one client believes it holds, and how it learns that it lost something.

Redis is the authority on who holds a lock; this registry is the client's view of its own holds,
kept in step with every script reply.  The watchdog renews the holds registered here, fixed
leases get a timer at their deadline, and a loss is recorded once: the hold is marked ``lost``,
logged, dropped from the registry, and its listeners (guards with ``cancel_on_loss``) are called.

Two key spaces, never mixed: a hold is known by its **registry key** (the lock key, plus a
suffix for each mode of a read-write lock, whose owner may hold both), and everything about the
hold itself (the :class:`Hold`, and an :class:`OwnerRecord` of its lost token and its releases
in flight) is keyed by (registry key, owner).  The *pending* work of an owner on a lock (a
release that has to finish in the background, the undo of a grant whose caller left), its
resent releases, aliases and abandoned calls concern the lock on the server and are keyed by
(**lock key**, owner): :class:`~aiolock._core.pending.PendingWork`, which :class:`Holds`
extends.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._redis.tasks import Background
from .metrics import lock_extra
from .pending import At, PendingWork

if TYPE_CHECKING:
    from .._scripts import Script
    from .metrics import Metrics, Tracing

__all__ = ["CLOCK_MARGIN", "Hold", "Holds", "NameCounters"]

# The scripts that keep deadlines on the server's clock read it in whole milliseconds (rounded
# down), so a deadline there may fall up to 1 ms before the send time plus the lease: the
# client takes a hold for lost that much earlier, never later.
CLOCK_MARGIN = 0.002

logger = logging.getLogger("aiolock.lock")


@dataclass(eq=False)
class NameCounters:
    """Per-name counters for ``statistics()``; shared by all lock objects of one name."""

    acquisitions: int = 0
    renewals: int = 0
    losses: int = 0
    waiters: int = 0
    contenders: int = 0  # tasks inside the wait loop (trying or parked)
    tickets: int = 0  # the last place in line handed to a task entering the wait loop
    last_lost: bool = False  # the most recent hold of this name ended in a loss
    # When (loop time) the last try of this client that the server refused was sent: a refusal
    # sent after one of this client's grants was refused by that incarnation of the lock.
    refused_sent_at: float = float("-inf")
    # Until when (time.monotonic()) this client last kept the plain lock's waiting set alive.
    waiting_kept_until: float = float("-inf")

    @property
    def first_tries(self) -> int:
        """Tasks inside the wait loop that have not joined the lock's channel: on a first try."""
        return self.contenders - self.waiters


@dataclass(eq=False)
class Hold:
    """One owner's hold on one lock, as the client last saw it.

    ``expires_at`` is a lower bound of the server-side expiry in event-loop time: the send time
    of the call that last set the lease, plus the lease.  ``watchdog`` holds are renewed, which
    moves it on; every hold has a timer at ``expires_at`` that marks it lost (a fresh grant's
    armed a pass after it), and :meth:`check_lost` once that moment has passed runs the
    timer's work at once.
    """

    name: str
    kind: str
    registry_key: str  # what the registry knows it by (see the module docstring)
    lock_key: str
    owner: str
    token: int
    count: int
    expires_at: float
    watchdog: bool
    task: asyncio.Task[Any] | None
    counters: NameCounters
    renew: Script  # the kind's renew script, which the watchdog batches by
    renew_keys: tuple[str, ...]  # the KEYS that script takes for this hold
    channels: tuple[str, ...]  # where this client's waiters for the lock park, if on channels
    # The registry's expiry (its rule: lost unless a release began in time), which the timer
    # runs and check_lost() past the deadline runs early.
    on_expiry: Callable[[Hold], None]
    lost: bool = False  # marked so by the registry (Holds.lose): no expiry run early
    lost_reason: str | None = None
    # No longer tracked (released, lost, its release's outcome unknown): nothing vouches for it.
    ended: bool = False
    timer: asyncio.TimerHandle | None = None
    listeners: list[Callable[[], object]] = field(default_factory=list)
    # Acquire requests of this hold that were resent (an earlier copy went out on a connection
    # that failed, and may still arrive): voided before the release that ends the hold.
    resent: list[int] = field(default_factory=list)
    # The trace span current when the hold was granted (the holder's operation), if traced.
    span: Any = None
    # When (loop time) the fresh grant's reply was read: the server made this incarnation of
    # the lock before then.
    granted_at: float = 0.0
    # A try of this client for the name was refused while the acquire that made it ran: the
    # lock is contended, and its release had better publish in the same call.
    contended: bool = False
    # When (loop time) the last call that found the hold on the server (its grant, a renewal)
    # was sent: a server that started after it may have lost the hold (see HoldKind._release).
    confirmed_at: float = 0.0
    # Released by the client if its task ends holding it (Holds.tie).
    tied: bool = False

    def check_lost(self) -> bool:
        """Whether the hold was lost: marked so, or its lease ran out by this client's clock
        (then marked so now, by the registry's expiry, which may fire its listeners).

        A loop that is busy past ``expires_at`` runs the timer only after the callbacks it has
        queued already, such as the holder's own code that resumed meanwhile: a read after that
        moment runs the timer's work itself, so the answer never depends on callback order.
        """
        if not self.lost and not self.ended:
            try:
                now = asyncio.get_running_loop().time()
            except RuntimeError:  # no running loop: the deadline cannot be checked
                return False
            # The deadline, not the timer: a grant's timer is armed a pass later.
            if now >= self.expires_at:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                self.on_expiry(self)
        return self.lost

    def valid_for(self) -> float:
        """Seconds the hold surely lasts by this client's clock (no I/O); 0.0 once it ended.

        ``expires_at`` counts from when the call that last set the lease was *sent*, and the
        server counts from when it ran it, later: so this never exceeds the server's PTTL.
        """
        if self.check_lost() or self.ended:
            return 0.0
        return max(0.0, self.expires_at - asyncio.get_running_loop().time())

    def __repr__(self) -> str:
        state = f"lost: {self.lost_reason}" if self.lost else f"held x{self.count}"
        return f"<Hold {self.name!r} token={self.token} [{state}]>"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_BARE = (
    ": that task ran nothing but the aiolock call that took it, so the lock was that task's "
    "(asyncio.create_task() and gather() run a call in a task of its own, and so does "
    "asyncio.wait_for() on Python 3.11); bound a wait with wait= or asyncio.timeout(), and "
    "give a lock that passes between tasks an explicit owner="
)


def _bare(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` ran nothing but an aiolock call (its hold surprises whoever awaited
    it: the warning says why)."""
    code = getattr(task.get_coro(), "cr_code", None)
    return code is not None and code.co_filename.startswith(_PACKAGE)


@dataclass(eq=False, slots=True)
class OwnerRecord:
    """What the registry keeps of one owner on one registry key besides its hold."""

    # The token of the owner's last hold lost, until its next grant: a grant that re-enters
    # that very hold is stale (see Settlement.reconcile).
    lost_token: int | None = None
    # When each release in flight began (loop time): a renewal answered meanwhile may find
    # the hold gone because of one of them, which is no loss (see in_release), nor is a lease
    # that runs out after one began (see _lease_ran_out).
    releases: list[float] = field(default_factory=list)
    # The lease ran out while a release was in flight: decided when the last one has ended.
    lapsed: bool = False

    def unused(self) -> bool:
        return self.lost_token is None and not self.releases and not self.lapsed


class Holds(PendingWork):
    """The registry of one client's holds, keyed by (registry key, owner); and the pending
    work of each (lock key, owner) (see the module docstring)."""

    def __init__(
        self,
        on_loss: Callable[[Hold], object] | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
        on_end: Callable[[Hold], object] | None = None,
    ) -> None:
        self._on_loss = on_loss  # told of every loss, after the hold's own listeners
        self._on_end = on_end  # told of every hold no longer tracked (released, lost, ...)
        # Every event below that a NameCounters counts is recorded here too, at the same line.
        self.metrics = metrics
        self.tracing = tracing
        # By (registry key, owner); and the same holds by registry key, then owner.
        self._holds: dict[At, Hold] = {}
        self._keyed: dict[str, dict[str, Hold]] = {}
        self._owners: dict[At, OwnerRecord] = {}
        super().__init__(self._holds_as)  # the work of each (lock key, owner)
        self.changed = asyncio.Event()  # set when a watchdog hold is added
        # The task-owned holds of each task that has had one, with what releases each: when
        # the task ends still holding them, the client releases them (see tie).
        self._tied: dict[
            asyncio.Task[Any], dict[Hold, Callable[[Hold], Coroutine[Any, Any, None]]]
        ] = {}
        self._callback_context = contextvars.Context()
        self._releasing_ended = Background()  # the releases of holds whose task ended

    def __len__(self) -> int:
        return len(self._holds)

    def __iter__(self) -> Iterator[Hold]:
        """Every hold the client believes it has (a snapshot: the registry may change)."""
        return iter(list(self._holds.values()))

    def get(self, registry_key: str, owner: str) -> Hold | None:
        return self._holds.get((registry_key, owner))

    def watched(self) -> list[Hold]:
        return [hold for hold in self._holds.values() if hold.watchdog]

    def lost_token(self, registry_key: str, owner: str) -> int | None:
        """The token of the owner's last hold that was lost (until its next grant)."""
        record = self._owners.get((registry_key, owner))
        return None if record is None else record.lost_token

    def by_key(self, registry_key: str) -> list[Hold]:
        return list(self._keyed.get(registry_key, {}).values())

    def watched_on(self, registry_key: str) -> bool:
        """Whether an owner of this client holds the lock with the watchdog: its hold ends
        only by a release or a loss, both of which this client hears of."""
        return any(hold.watchdog for hold in self._keyed.get(registry_key, {}).values())

    def _holds_as(self, lock_key: str, owner: str) -> bool:
        """Whether ``owner`` has a hold on the lock ``lock_key`` (in any mode)."""
        return any(h.lock_key == lock_key and h.owner == owner for h in self._holds.values())

    def _record(self, at: At) -> OwnerRecord:
        record = self._owners.get(at)
        if record is None:
            record = self._owners[at] = OwnerRecord()
        return record

    def _tidy(self, at: At) -> None:
        record = self._owners.get(at)
        if record is not None and record.unused():
            del self._owners[at]

    # -- script replies ---------------------------------------------------------------------

    def record_grant(
        self,
        *,
        name: str,
        kind: str,
        registry_key: str,
        lock_key: str,
        owner: str,
        reply: list[int],
        sent_at: float,
        started: float,
        watchdog: bool,
        counters: NameCounters,
        task: asyncio.Task[Any] | None,
        renew: Script,
        renew_keys: tuple[str, ...],
        channels: tuple[str, ...],
    ) -> Hold:
        """Record a grant ``[token, count, pttl]``, as the kind read it from its acquire
        script's reply (``KindHooks.grant_of``).

        ``started``: when the acquire call began (loop time), for the wait it took.
        """
        token, count, pttl = (int(value) for value in reply)
        expires_at = sent_at + pttl / 1000 - CLOCK_MARGIN
        at = (registry_key, owner)
        if (record := self._owners.get(at)) is not None:
            record.lost_token = None
            self._tidy(at)
        hold = self._holds.get(at)
        if hold is not None and hold.token != token:
            # Our previous hold vanished (expired or forced) and this is a fresh grant.
            self.lose(hold, "the lease ran out before the owner acquired the lock again")
            hold = None
        if hold is None:
            hold = Hold(
                name,
                kind,
                registry_key,
                lock_key,
                owner,
                token,
                count,
                expires_at,
                watchdog,
                task,
                counters,
                renew,
                renew_keys,
                channels,
                self._lease_ran_out,
            )
            hold.granted_at = asyncio.get_running_loop().time()
            hold.confirmed_at = sent_at
            hold.contended = counters.refused_sent_at >= started
            self._holds[at] = hold
            self._keyed.setdefault(registry_key, {})[owner] = hold
            counters.acquisitions += 1
            counters.last_lost = False
            if self.metrics is not None:
                self.metrics.acquired(kind, asyncio.get_running_loop().time() - started)
        else:
            hold.count = count
            hold.expires_at = max(hold.expires_at, expires_at)
            hold.confirmed_at = max(hold.confirmed_at, sent_at)
            hold.watchdog = hold.watchdog or watchdog
        if hold.watchdog:
            self.changed.set()
        # Watchdog holds get the timer too: a renewal that hangs (a frozen TCP path) must not
        # let the hold outlive its lease unnoticed.  A fresh hold's is armed on the loop's next
        # pass, which in a cycle of calls runs while the caller's next call is on the wire
        # (check_lost reads the deadline itself meanwhile; a deadline already past fires a
        # pass later).  A re-entered hold's is moved at once: its old timer, due in this very
        # pass perhaps, must not take the hold for lost.
        if hold.timer is not None:
            self._arm_timer(hold)
        else:
            asyncio.get_running_loop().call_soon(self._arm_held, hold)
        return hold

    def renewed(self, hold: Hold, sent_at: float, lease: float) -> None:
        """A renewal sent at ``sent_at`` landed: the lease now ends no earlier than ``lease``
        seconds after it."""
        hold.counters.renewals += 1
        if self.metrics is not None:
            self.metrics.renewed(hold.kind)
        hold.confirmed_at = max(hold.confirmed_at, sent_at)
        expires_at = sent_at + lease - CLOCK_MARGIN
        if expires_at > hold.expires_at:
            hold.expires_at = expires_at
            self._arm_timer(hold)

    def cap(self, hold: Hold, expires_at: float) -> None:
        """The hold may end as early as ``expires_at`` (an extend to a shorter lease is on its
        way): the client counts on no more than that from now on."""
        if expires_at < hold.expires_at and not hold.ended:
            hold.expires_at = expires_at
            self._arm_timer(hold)

    def relet(self, hold: Hold, sent_at: float, lease: float) -> None:
        """An extend sent at ``sent_at`` set the hold's lease to ``lease`` seconds (longer or
        shorter than the one it replaced): it now ends no earlier than that after it."""
        if hold.ended:  # released or lost meanwhile: no timer for what is no longer tracked
            return
        hold.confirmed_at = max(hold.confirmed_at, sent_at)
        hold.expires_at = sent_at + lease - CLOCK_MARGIN
        self._arm_timer(hold)

    def released(self, registry_key: str, owner: str, remaining: int | None) -> Hold | None:
        """Record a release reply: holds left, or ``None`` when the owner no longer held it.

        Returns the hold that was lost, if the release revealed a loss.
        """
        hold = self._holds.get((registry_key, owner))
        if hold is None:
            return None
        if remaining is None:
            self.lose(hold, "the lock was no longer held by its owner at release")
            return hold
        if remaining == 0:
            self.forget(hold)
        else:
            hold.count = remaining
        return None

    def tie(self, hold: Hold, release: Callable[[Hold], Coroutine[Any, Any, None]]) -> None:
        """Run ``release(hold)`` in the background if the hold's task ends while the hold is
        tracked."""
        task = hold.task
        assert task is not None
        tied = self._tied.get(task)
        if tied is None:
            tied = self._tied[task] = {}
            task.add_done_callback(self._task_ended, context=self._callback_context)
        tied[hold] = release
        hold.tied = True

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A task ended: it can release nothing now, so the client releases what it held
        (owner identities are never reused, so nobody else can)."""
        for hold, release in self._tied.pop(task, {}).items():
            logger.warning(
                "task %s ended holding %s %r (x%d); releasing it%s",
                task.get_name(),
                hold.kind,
                hold.name,
                hold.count,
                _BARE if _bare(task) else "",
                extra=lock_extra(hold.kind, hold.name, hold.owner),
            )
            # Not a settlement of the owner (defer): the release waits for those itself.
            self._releasing_ended.spawn(release(hold))

    def forget(self, hold: Hold) -> None:
        """Stop tracking ``hold`` (released, or its outcome unknown): no renewals, no timer."""
        if hold.task is not None and (tied := self._tied.get(hold.task)) is not None:
            tied.pop(hold, None)
        hold.ended = True
        at = (hold.registry_key, hold.owner)
        tracked = self._holds.get(at) is hold
        if tracked:
            del self._holds[at]
            keyed = self._keyed[hold.registry_key]
            del keyed[hold.owner]
            if not keyed:
                del self._keyed[hold.registry_key]
            if self.metrics is not None:
                self.metrics.ended(hold.kind)
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
        if tracked and self._on_end is not None:
            self._on_end(hold)

    def lose(self, hold: Hold, reason: str) -> None:
        """Mark ``hold`` lost, once: log it, forget it, and tell its listeners."""
        if hold.lost:
            return
        self._record((hold.registry_key, hold.owner)).lost_token = hold.token
        hold.lost = True
        hold.lost_reason = reason
        hold.counters.losses += 1
        hold.counters.last_lost = True
        if self.metrics is not None:
            self.metrics.lost(hold.kind)
        if self.tracing is not None:
            self.tracing.lost(hold)
        self.forget(hold)
        logger.warning(
            "%s %r (token %d) lost: %s",
            hold.kind,
            hold.name,
            hold.token,
            reason,
            extra=lock_extra(hold.kind, hold.name, hold.owner),
        )
        for listener in hold.listeners:
            listener()
        if self._on_loss is not None:
            self._on_loss(hold)

    def lose_all(self, registry_key: str, reason: str) -> None:
        for hold in self.by_key(registry_key):
            self.lose(hold, reason)

    def _arm_held(self, hold: Hold) -> None:
        """Arm the timer of a hold still tracked (a grant's, a pass later)."""
        if not hold.ended:
            self._arm_timer(hold)

    def _arm_timer(self, hold: Hold) -> None:
        if hold.timer is not None:
            hold.timer.cancel()
        loop = asyncio.get_running_loop()
        hold.timer = loop.call_at(hold.expires_at, self._lease_ran_out, hold)

    def _lease_ran_out(self, hold: Hold) -> None:
        """The hold's lease ran out as the client counts it (its timer, or a check after a
        release): it is lost, unless its owner began releasing it before then."""
        record = self._owners.get((hold.registry_key, hold.owner))
        if record is not None and record.releases and min(record.releases) < hold.expires_at:
            # The critical section ended in time.  A loop that was blocked may run this timer
            # before it reads the release's reply: that reply decides (see releasing).
            record.lapsed = True
            return
        self.lose(hold, "its lease ran out while it was held")

    @contextlib.contextmanager
    def releasing(self, registry_key: str, owner: str) -> Iterator[None]:
        """Mark a release of the owner's hold as in flight while the block runs (a release's
        own, :meth:`release_begun` and :meth:`release_ended`, cost no context manager)."""
        began = asyncio.get_running_loop().time()
        self.release_begun(registry_key, owner, began)
        try:
            yield
        finally:
            # Once the caller has recorded the reply (no await in between): a hold still
            # tracked then (an inner release of a reentrant hold, or a release that failed)
            # outlived its lease (see release_ended).
            self.release_ended(registry_key, owner, began)

    # -- releases in flight (marked from any thread: aiolock.sync sends some itself) ----------

    def release_begun(self, registry_key: str, owner: str, began: float) -> None:
        """Mark a release of the owner's hold as in flight from ``began`` (the loop's clock,
        ``loop.time()``, which any thread may read) until :meth:`release_ended`: a renewal
        answered meanwhile is no verdict.  From any thread: a thread that sends the owner's
        release itself marks it before it writes it (a dict and a list step, each atomic under
        the GIL; only that owner's own calls change its record meanwhile), and posts
        :meth:`release_ended` to the loop with the reply."""
        self._record((registry_key, owner)).releases.append(began)

    def release_ended(self, registry_key: str, owner: str, began: float) -> None:
        """On the loop: the release marked by :meth:`release_begun` is answered (or its
        outcome handed to settlement).  A lease that ran out meanwhile is checked on the next
        pass, once the caller has recorded the reply."""
        at = (registry_key, owner)
        record = self._owners.get(at)
        if record is None or began not in record.releases:
            return  # the client closed meanwhile (clear): nothing is tracked any more
        record.releases.remove(began)
        if not record.releases:
            lapsed, record.lapsed = record.lapsed, False
            self._tidy(at)
            if lapsed:
                asyncio.get_running_loop().call_soon(self._check_lease, at)

    def quiet(self, lock_key: str, owner: str) -> bool:
        """Whether no fault left anything on record for the owner on ``lock_key``: no pending
        work, no other id (:meth:`alias`), no late release (:meth:`late_releases`).  Dict
        lookups only, so that aiolock.sync's calling thread may ask before it sends a first
        try or a release itself (the loop path waits for such work first)."""
        at = (lock_key, owner)
        return at not in self._pending and at not in self._aliases and at not in self._late

    def _check_lease(self, at: At) -> None:
        hold = self._holds.get(at)
        if hold is not None and asyncio.get_running_loop().time() >= hold.expires_at:
            self._lease_ran_out(hold)

    def answering(self, hold: Hold) -> contextlib.AbstractContextManager[None]:
        """Mark a call that changes ``hold``'s lease (an extend) as in flight: as for a release,
        its reply decides whether the lease ran out meanwhile, not the timer."""
        return self.releasing(hold.registry_key, hold.owner)

    def in_release(self, hold: Hold) -> bool:
        """Whether a release of ``hold``'s owner is in flight.

        A renewal that the server applied after that release finds the lock gone, and its
        answer can be read before the release's: it says nothing about a loss.  The release's
        own reply does (``released``), one round trip later.
        """
        record = self._owners.get((hold.registry_key, hold.owner))
        return record is not None and bool(record.releases)

    # -- closing -----------------------------------------------------------------------------

    def pending(self) -> list[asyncio.Task[Any]]:
        """Background work the client waits for as it closes: settlements, and the releases
        of holds whose task ended."""
        return [*self._pending.values(), *self._releasing_ended.tasks()]

    def clear(self) -> None:
        self._tied.clear()
        for hold in list(self._holds.values()):
            self.forget(hold)
        self._owners.clear()
        self.clear_pending()
