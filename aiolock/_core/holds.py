"""What one client believes it holds, and how it learns that it lost something.

Redis is the authority on who holds a lock; this registry is the client's view of its own holds,
kept in step with every script reply.  The watchdog renews the holds registered here, fixed
leases get a timer at their deadline, and a loss is recorded once: the hold is marked ``lost``,
logged, dropped from the registry, and its listeners (guards with ``cancel_on_loss``) are called.

It also keeps the *pending* work of each (lock, owner): a release that has to finish in the
background (its caller was cancelled, or the reply never came) and the compensating release of a
grant whose caller was cancelled.  The owner's next operation on that lock waits for it first, so
hold counts stay exact.
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

if TYPE_CHECKING:
    from .._scripts import Script
    from .metrics import Metrics, Tracing

__all__ = ["CLOCK_MARGIN", "Hold", "Holds", "NameCounters"]

# The scripts that keep deadlines on the server's clock read it in whole milliseconds (rounded
# down), so a deadline there may fall up to 1 ms before the send time plus the lease: the
# client takes a hold for lost that much earlier, never later.
CLOCK_MARGIN = 0.002

logger = logging.getLogger("aiolock.lock")

# How long after a background release gave up a hold it left may still be met: leases in use
# are seconds to minutes; past this, meeting one is a bug signal again.
ABANDONED_FOR = 600.0

# The (key, owner)s whose deferred work the running task is (or was started from): work
# deferred for a (key, owner) must never wait for that (key, owner)'s settlement, its own.
_SETTLING: contextvars.ContextVar[frozenset[tuple[str, str]]] = contextvars.ContextVar(
    "aiolock_settling", default=frozenset()
)


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
    moves it on; every hold has a timer at ``expires_at`` that marks it lost, and reading
    :attr:`lost` once that moment has passed runs the timer's work at once.
    """

    name: str
    kind: str
    key: str
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
    # runs and a read of ``lost`` past the deadline runs early.
    on_expiry: Callable[[Hold], None]
    marked_lost: bool = False  # by the registry (Holds.lose): read ``lost``
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

    @property
    def lost(self) -> bool:
        """Whether the hold was lost: marked so, or its lease ran out by this client's clock.

        A loop that is busy past ``expires_at`` runs the timer only after the callbacks it has
        queued already, such as the holder's own code that resumed meanwhile: a read after that
        moment runs the timer's work itself, so the answer never depends on callback order.
        """
        timer = self.timer
        if timer is not None and not self.marked_lost:
            try:
                now = asyncio.get_running_loop().time()
            except RuntimeError:  # no running loop: the deadline cannot be checked
                return False
            if now >= timer.when():
                timer.cancel()
                self.timer = None
                self.on_expiry(self)
        return self.marked_lost

    def valid_for(self) -> float:
        """Seconds the hold surely lasts by this client's clock (no I/O); 0.0 once it ended.

        ``expires_at`` counts from when the call that last set the lease was *sent*, and the
        server counts from when it ran it, later: so this never exceeds the server's PTTL.
        """
        if self.lost or self.ended:
            return 0.0
        return max(0.0, self.expires_at - asyncio.get_running_loop().time())

    def __repr__(self) -> str:
        state = f"lost: {self.lost_reason}" if self.marked_lost else f"held x{self.count}"
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


class Holds:
    """The registry of one client's holds, keyed by (lock key, owner)."""

    def __init__(
        self,
        on_loss: Callable[[Hold], object] | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._on_loss = on_loss  # told of every loss, after the hold's own listeners
        # Every event below that a NameCounters counts is recorded here too, at the same line.
        self.metrics = metrics
        self.tracing = tracing
        self._holds: dict[tuple[str, str], Hold] = {}
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        # The token of each (key, owner)'s last hold lost, until its next grant: a grant that
        # re-enters that very hold is stale (see Settlement.reconcile).
        self._lost_tokens: dict[tuple[str, str], int] = {}
        # When a background release of each (lock, owner) last gave up (loop time, oldest
        # first): a hold it left may still be met for a while, and that is no bug.
        self._abandoned: dict[tuple[str, str], float] = {}
        # When each release in flight per (key, owner) began (loop time): a renewal answered
        # meanwhile may find the hold gone because of one of them, which is no loss (see
        # in_release), nor is a lease that runs out after one began (see _lease_ran_out).
        self._releasing: dict[tuple[str, str], list[float]] = {}
        # The (key, owner)s whose lease ran out while a release was in flight: decided when
        # the last of those releases has ended (see releasing).
        self._lapsed: set[tuple[str, str]] = set()
        # The releases of each (key, owner) that were resent lately, and the timer that drops
        # them at the end of the resend window (see resent_release): faults only.
        self._late: dict[tuple[str, str], tuple[list[int], asyncio.TimerHandle]] = {}
        # The id each (key, owner) goes by for a while (see alias), and whose alias each is.
        self._aliases: dict[tuple[str, str], tuple[str, float]] = {}
        self._bases: dict[tuple[str, str], str] = {}
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

    def get(self, key: str, owner: str) -> Hold | None:
        return self._holds.get((key, owner))

    def watched(self) -> list[Hold]:
        return [hold for hold in self._holds.values() if hold.watchdog]

    def lost_token(self, key: str, owner: str) -> int | None:
        """The token of the owner's last hold on ``key`` that was lost (until its next grant)."""
        return self._lost_tokens.get((key, owner))

    def by_key(self, key: str) -> list[Hold]:
        return [hold for (k, _), hold in self._holds.items() if k == key]

    # -- script replies ---------------------------------------------------------------------

    def record_grant(
        self,
        *,
        name: str,
        kind: str,
        key: str,
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
        self._lost_tokens.pop((key, owner), None)
        hold = self._holds.get((key, owner))
        if hold is not None and hold.token != token:
            # Our previous hold vanished (expired or forced) and this is a fresh grant.
            self.lose(hold, "the lease ran out before the owner acquired the lock again")
            hold = None
        if hold is None:
            hold = Hold(
                name,
                kind,
                key,
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
            self._holds[(key, owner)] = hold
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
        # let the hold outlive its lease unnoticed.
        self._arm_timer(hold)
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

    def released(self, key: str, owner: str, remaining: int | None) -> Hold | None:
        """Record a release reply: holds left, or ``None`` when the owner no longer held it.

        Returns the hold that was lost, if the release revealed a loss.
        """
        hold = self._holds.get((key, owner))
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
        if self._holds.get((hold.key, hold.owner)) is hold:
            del self._holds[(hold.key, hold.owner)]
            if self.metrics is not None:
                self.metrics.ended(hold.kind)
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None

    def lose(self, hold: Hold, reason: str) -> None:
        """Mark ``hold`` lost, once: log it, forget it, and tell its listeners."""
        if hold.marked_lost:
            return
        self._lost_tokens[(hold.key, hold.owner)] = hold.token
        hold.marked_lost = True
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

    def lose_all(self, key: str, reason: str) -> None:
        for hold in self.by_key(key):
            self.lose(hold, reason)

    def _arm_timer(self, hold: Hold) -> None:
        if hold.timer is not None:
            hold.timer.cancel()
        loop = asyncio.get_running_loop()
        hold.timer = loop.call_at(hold.expires_at, self._lease_ran_out, hold)

    def _lease_ran_out(self, hold: Hold) -> None:
        """The hold's lease ran out as the client counts it (its timer, or a check after a
        release): it is lost, unless its owner began releasing it before then."""
        at = (hold.key, hold.owner)
        starts = self._releasing.get(at)
        if starts and min(starts) < hold.expires_at:
            # The critical section ended in time.  A loop that was blocked may run this timer
            # before it reads the release's reply: that reply decides (see releasing).
            self._lapsed.add(at)
            return
        self.lose(hold, "its lease ran out while it was held")

    @contextlib.contextmanager
    def releasing(self, key: str, owner: str) -> Iterator[None]:
        """Mark a release of the owner's hold on ``key`` as in flight while the block runs."""
        at = (key, owner)
        loop = asyncio.get_running_loop()
        began = loop.time()
        self._releasing.setdefault(at, []).append(began)
        try:
            yield
        finally:
            starts = self._releasing[at]
            starts.remove(began)
            if not starts:
                del self._releasing[at]
                if at in self._lapsed:
                    self._lapsed.discard(at)
                    # Once the caller has recorded the reply (no await in between): a hold
                    # still tracked then (an inner release of a reentrant hold, or a release
                    # that failed) outlived its lease.
                    loop.call_soon(self._check_lease, at)

    # -- a release made off the loop (aiolock.sync's calling thread) --------------------------

    def release_begun(self, key: str, owner: str, began: float) -> None:
        """What :meth:`releasing` marks as its block begins, from any thread: a thread that
        sends the owner's release itself marks it before it writes it (one dict and one list
        step, each atomic under the GIL), so that a renewal answered meanwhile is no verdict.
        ``began``: the loop's clock then (``loop.time()``, which any thread may read).
        :meth:`release_ended` is posted to the loop with the reply."""
        self._releasing.setdefault((key, owner), []).append(began)

    def release_ended(self, key: str, owner: str, began: float) -> None:
        """On the loop: the release marked by :meth:`release_begun` is answered (or its
        outcome handed to settlement), as :meth:`releasing`'s block ends."""
        at = (key, owner)
        starts = self._releasing[at]
        starts.remove(began)
        if not starts:
            del self._releasing[at]
            if at in self._lapsed:
                self._lapsed.discard(at)
                asyncio.get_running_loop().call_soon(self._check_lease, at)

    def quiet(self, key: str, owner: str) -> bool:
        """Whether no fault left anything on record for the owner on ``key``: no pending
        settlement, no other id (:meth:`alias`), no late release (:meth:`late_releases`).
        Dict lookups only, so that aiolock.sync's calling thread may ask before it sends a
        first try or a release itself (the loop path waits for such work first)."""
        at = (key, owner)
        return at not in self._pending and at not in self._aliases and at not in self._late

    def _check_lease(self, at: tuple[str, str]) -> None:
        hold = self._holds.get(at)
        if hold is not None and asyncio.get_running_loop().time() >= hold.expires_at:
            self._lease_ran_out(hold)

    def answering(self, hold: Hold) -> contextlib.AbstractContextManager[None]:
        """Mark a call that changes ``hold``'s lease (an extend) as in flight: as for a release,
        its reply decides whether the lease ran out meanwhile, not the timer."""
        return self.releasing(hold.key, hold.owner)

    def in_release(self, hold: Hold) -> bool:
        """Whether a release of ``hold``'s owner on its key is in flight.

        A renewal that the server applied after that release finds the lock gone, and its
        answer can be read before the release's: it says nothing about a loss.  The release's
        own reply does (``released``), one round trip later.
        """
        return (hold.key, hold.owner) in self._releasing

    # -- pending background settlements ------------------------------------------------------

    def defer(self, key: str, owner: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background; the owner's next call on ``key`` waits for it.

        The rule that keeps this free of deadlock: ``work`` never settles (:meth:`settle`)
        the same ``(key, owner)``, directly or through an acquire or release of that owner
        on that key, since it would wait for itself.  It may defer more work there (which
        runs after it).  The rule is checked: such a ``settle`` raises ``RuntimeError``.
        """
        previous = self._pending.get((key, owner))

        async def chained() -> None:
            # In this task's own context (and those of the tasks it starts): see settle.
            _SETTLING.set(_SETTLING.get() | {(key, owner)})
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            await work

        task = asyncio.get_running_loop().create_task(chained())
        self._pending[(key, owner)] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._pending.get((key, owner)) is finished:
                del self._pending[(key, owner)]
            if not finished.cancelled() and finished.exception() is not None:
                logger.warning("background release of %s failed: %r", key, finished.exception())

        task.add_done_callback(done)

    async def settle(self, key: str, owner: str) -> None:
        """Wait for the owner's pending work on ``key`` (its failures never reach the caller);
        for an id :meth:`alias` gave, the work of the owner's earlier ids on ``key`` first.

        :raises RuntimeError: called from that very work (see :meth:`defer`), which would
            wait for itself forever.
        """
        ats = [(key, owner)]
        base = self._bases.get((key, owner))
        if base is not None:
            # An id :meth:`alias` gave waits for the owner's earlier ids too: the release that
            # made it is settled under the id it ended, which may hold the lock until then.
            earlier = [
                at for at in self._pending if at[0] == key and base in (at[1], self._bases.get(at))
            ]
            ats = [at for at in earlier if at != (key, owner)] + ats
        for at in ats:
            if at in _SETTLING.get():
                raise RuntimeError(
                    f"deferred work of owner {at[1]!r} on {key!r} waits for its own settlement "
                    "(it acquires or releases that key as that owner): it would never end"
                )
        for at in ats:
            while (task := self._pending.get(at)) is not None:
                await asyncio.wait([task])
                if self._pending.get(at) is task:
                    del self._pending[at]

    def abandoned(self, key: str, owner: str) -> None:
        """A background release of the owner's hold on ``key`` gave up: the hold may linger."""
        now = asyncio.get_running_loop().time()
        abandoned = self._abandoned
        while abandoned:  # forget the old ones, so that owners that never return cost nothing
            first = next(iter(abandoned))
            if abandoned[first] > now - ABANDONED_FOR:
                break
            del abandoned[first]
        abandoned.pop((key, owner), None)
        abandoned[(key, owner)] = now

    def was_abandoned(self, key: str, owner: str) -> bool:
        """Whether a background release of the owner's hold on ``key`` gave up lately (the
        record is used up)."""
        when = self._abandoned.pop((key, owner), None)
        return when is not None and when > asyncio.get_running_loop().time() - ABANDONED_FOR

    # -- resent releases ---------------------------------------------------------------------

    def resent_release(self, key: str, owner: str, request: int, window: float) -> None:
        """The owner's release ``request`` on ``key`` was resent (a copy went out on a
        connection that failed) and is answered now (or given up on): that copy may still
        arrive, after the owner acquired again, and must not release the newer hold.

        Kept for ``window`` seconds (the client's resend window; from the last such release of
        the owner): meanwhile the owner's acquires of the lock carry it (:meth:`late_releases`),
        and the hold they make or re-enter refuses that copy (``release_one`` in
        ``scripts/common/_hold.lua``).  Nothing is kept without a fault.
        """
        at = (key, owner)
        entry = self._late.get(at)
        requests: list[int] = []
        if entry is not None:
            requests = entry[0]
            entry[1].cancel()
        if request not in requests:
            requests.append(request)
        timer = asyncio.get_running_loop().call_later(window, self._late.pop, at, None)
        self._late[at] = (requests, timer)

    def alias(self, key: str, owner: str) -> str:
        """The id ``owner`` goes by on ``key`` now: itself, but for the resend window after a
        release of it that was a plain command (an HDEL of its fields) and may still have a
        copy on its way (it was resent, or its outcome is unknown), and for as long as a hold
        made under that other id lasts.  A plain command cannot refuse its own late copy, which
        would end the owner's next hold: that hold goes by another id.  Faults only: without
        one this is a test of an empty dict."""
        if not self._aliases:
            return owner
        found = self._aliases.get((key, owner))
        if found is None:
            return owner
        alias, until = found
        at = (key, alias)
        if asyncio.get_running_loop().time() < until or at in self._holds or at in self._pending:
            return alias
        del self._aliases[(key, owner)]
        self._bases.pop(at, None)
        return owner

    def realias(self, key: str, owner: str, request: int, window: float) -> None:
        """``owner`` (an id :meth:`alias` gave, or the owner's own) sent release ``request`` of
        ``key`` as a plain command that may still arrive late: the owner's holds of ``key`` go
        by a new id for ``window`` seconds (see :meth:`alias`)."""
        base = self._bases.get((key, owner), owner)
        # After the client's id, where no owner's own id has ``a<n>:`` (they have ``x:``, ``t``,
        # ``h``, ``p``): no explicit owner's name makes another's alias, and the prefix that
        # the fair lock's scripts read as the client stays.
        client, _, rest = base.partition(":")
        alias = f"{client}:a{request}:{rest}"
        now = asyncio.get_running_loop().time()
        for at, (old, until) in list(self._aliases.items()):  # few: one per recent fault
            if until <= now and (at[0], old) not in self._holds:
                del self._aliases[at]
                self._bases.pop((at[0], old), None)
        self._aliases[(key, base)] = (alias, now + window)
        self._bases[(key, alias)] = base

    def late_releases(self, key: str, owner: str) -> list[int]:
        """The owner's releases on ``key`` resent within the resend window (see
        :meth:`resent_release`); none, without a fault."""
        entry = self._late.get((key, owner))
        return [] if entry is None else entry[0]

    def pending(self) -> list[asyncio.Task[Any]]:
        """Background work the client waits for as it closes: settlements, and the releases
        of holds whose task ended."""
        return [*self._pending.values(), *self._releasing_ended.tasks()]

    def clear(self) -> None:
        self._tied.clear()
        for hold in list(self._holds.values()):
            self.forget(hold)
        self._lost_tokens.clear()
        self._abandoned.clear()
        for _, timer in self._late.values():
            timer.cancel()
        self._late.clear()
        self._aliases.clear()
        self._bases.clear()
