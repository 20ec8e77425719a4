"""The wait loop and one attempt: the engine's :class:`Acquiring` part.

**The wait loop** (:meth:`Acquiring.wait_for_grant`), as in Redisson's ``RedissonLock.tryLock``:
try; on failure park until a wake-up or the pause the try returned (the lock's remaining
lease, say) runs out; repeat until the deadline.  How a waiter parks is the kind's
:class:`~aiolock._core.waiting.WaitStrategy`.

**One attempt** (:meth:`Acquiring._attempt_once`): send the kind's acquire call, read its
reply (:meth:`~KindHooks.grant_of`, :meth:`~KindHooks._refusal_pause`), reconcile a grant with what
the client knows (:meth:`Settlement.reconcile`), record it.  A grant whose reply the caller
never saw is undone by :mod:`aiolock._core.settlement`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Final

from redis.exceptions import RedisError, ResponseError

from .._scripts import Call
from .holds import Hold
from .release import Releasing
from .settlement import Attempt, until_it_lands
from .waiting import MessageGrant, WaitStrategy

__all__ = ["Acquiring", "OwnerTask", "countable"]

# A grant a message brought with less lease left than this (or a third of it) by the client's
# clock is taken by a try instead, whose reply tells the lease left.
_SHORTEST_GRANT: Final = 0.05


def countable(lease_ms: int, asked_ms: int, *, watchdog: bool, left: float) -> bool:
    """Whether a grant a message brought for ``lease_ms`` can be recorded as it is, for a call
    that asked for ``asked_ms`` (``watchdog``: a ``lease=None`` call), with ``left`` seconds
    of that lease left by the client's clock: not if a kind capped the lease asked (a try gets
    it), nor with too little left (a try tells how much)."""
    if lease_ms > asked_ms or (lease_ms < asked_ms and not watchdog):
        return False
    return left >= max(lease_ms / 3000, _SHORTEST_GRANT)


logger = logging.getLogger("aiolock.lock")

OwnerTask = tuple[str, "asyncio.Task[Any] | None"]
"""An owner id and the task whose end stops the watchdog renewing its holds."""


class Acquiring(Releasing):
    """The wait loop and one attempt (see the module docstring)."""

    __slots__ = ()

    def current_owner(self) -> OwnerTask:
        """The calling owner: the lock's explicit owner, or the current task's."""
        services = self._services.check_open()
        owner, task = services.owners.current(self._explicit_owner)
        return services.holds.alias(self._keys.lock, owner), task

    def caller_hold(self) -> Hold:
        """The calling owner's hold, right after an acquire returned (no await in between)."""
        owner, _ = self.current_owner()
        hold = self._services.holds.get(self._registry_key, owner)
        if hold is None:  # the grant registers it: never, short of a bug
            raise RuntimeError(f"lock {self.name!r} was granted but is not registered")
        return hold

    # -- acquiring within a wait -------------------------------------------------------------

    def try_until(
        self, wait: float, lease: float | None, who: OwnerTask | None = None
    ) -> Coroutine[Any, Any, bool]:
        """Acquire within ``wait`` seconds: ``True`` once held, ``False`` when it ran out.

        ``wait=0`` is one attempt, however long that call takes.  Any other ``wait`` bounds the
        whole acquire, calls in flight included (a stalled server or a frozen connection cannot
        hold the caller past it): a grant that arrives after the deadline is undone in the
        background, as for a cancelled caller.  ``who``: an owner the caller names (a
        semaphore's permit), instead of the calling owner.

        Not a coroutine function: a waiting task carries no frame of it.
        """
        if wait == 0:
            return self._try_once(lease, who)
        deadline = asyncio.get_running_loop().time() + wait
        return self._wait_for_grant_until(lease, deadline, who)

    async def _try_once(self, lease: float | None, who: OwnerTask | None = None) -> bool:
        owner, task = self.current_owner() if who is None else who
        if isinstance(await self.acquire_as(owner, task, lease), Hold):
            return True
        self._timed_out()
        return False

    async def _wait_for_grant_until(
        self, lease: float | None, deadline: float, who: OwnerTask | None = None
    ) -> bool:
        try:
            async with asyncio.timeout_at(deadline) as timeout:
                await self.wait_for_grant(lease, who)
                return True
        except TimeoutError:
            if timeout.expired():
                self._timed_out()
                return False
            raise

    def _timed_out(self) -> None:
        """An acquire's ``wait`` ran out (the one place timeouts are counted)."""
        metrics = self._services.metrics
        if metrics is not None:
            metrics.timed_out(self.kind)

    # -- the wait loop -----------------------------------------------------------------------

    async def wait_for_grant(self, lease: float | None, who: OwnerTask | None = None) -> None:
        """The wait loop (see the module docstring); a caller with a deadline bounds it.

        The owner is the task that runs it, not the one that made the coroutine
        (``asyncio.create_task(lock.lock())`` acquires for the new task), unless ``who`` names
        one.
        """
        owner, task = self.current_owner() if who is None else who
        started = asyncio.get_running_loop().time()
        await self._services.holds.wait_pending(self._keys.lock, owner)
        waiting = self._wait_strategy(owner, lease)
        explicit = who is None and self._explicit_owner is not None
        if explicit:
            self._state.join(owner, waiting)
        granted = False
        try:
            pause = waiting.first_pause()
            while True:
                if pause is None:
                    # The strategy may bound the tries in flight: a call waiting for its turn
                    # costs a future here, no frames of a call (thousands arrive at once).
                    turn = waiting.turn()
                    if turn is not None:
                        try:
                            await turn
                        except asyncio.CancelledError:
                            if turn.done() and not turn.cancelled():
                                waiting.tried()  # given the turn as it was cancelled: pass it on
                            raise
                        # Let go of the spent future: this frame lives for the whole wait.
                        del turn
                    try:
                        outcome = await self._try_acquire(owner, task, lease, started)
                    finally:
                        waiting.tried()
                    if isinstance(outcome, Hold):
                        granted = True
                        waiting.granted(outcome.expires_at)
                        return
                    pause = outcome
                waiter = waiting.park(pause)
                pause = None
                try:
                    await waiter
                except asyncio.CancelledError:
                    # A grant a message brought meanwhile is left untaken: the withdraw that
                    # leaving without the lock sends takes it back (see _gave_up).
                    waiting.unpark(waiter)
                    raise
                grant = waiting.woken()
                if grant is not None:
                    hold = self._accept(owner, task, lease, started, grant)
                    if hold is not None:
                        granted = True
                        waiting.granted(hold.expires_at)
                        return
        finally:
            granted = granted or waiting.handed_over()
            self._left(owner, waiting, granted=granted, explicit=explicit)

    def _left(self, owner: str, waiting: WaitStrategy, *, granted: bool, explicit: bool) -> None:
        """A call of ``owner`` leaves the wait loop (``explicit``: its owner is explicit, and
        may have other calls waiting)."""
        try:
            # First: its withdraw may need the waiting's record.  The owner's place on the
            # server is also its other waiting calls' (one owner): they keep it.
            if not granted and not (explicit and self._state.others_wait(owner)):
                self._gave_up(owner)
        finally:
            waiting.leave(granted)
            if explicit:
                self._state.leave(owner, waiting, granted=granted)

    def _gave_up(self, owner: str) -> None:
        """A waiting call left without the lock (timeout, cancellation, error).

        A kind that keeps its waiters on the server (a queue) has them withdraw at once.  That
        is idempotent, so it is sent for every call that leaves without the lock, also one
        cancelled while its try (which may have queued it) was in flight: settled after that
        try, like the rest of the owner's pending work.
        """
        call = self.withdraw_call(owner)
        if call is None:
            return
        services = self._services
        after = self.withdraw_after(call)

        async def withdraw() -> None:
            # Sent until it lands, the waiter's entry surely ended (fair_wait_timeout after
            # its last try), or the client closed: until then the entry holds others back.
            # Sent also while the client closes: closing waits for it (see Client.aclose).
            give_up = asyncio.get_running_loop().time() + services.fair_wait_timeout
            if after is not None:
                # A release that enters the owner again lands first, or the wait runs out
                # (asyncio.wait: running out cancels nothing that a thread may still settle).
                await asyncio.wait({after}, timeout=services.fair_wait_timeout)
            try:
                await until_it_lands(lambda: services.calls.run(*call), give_up, services)
            except (RedisError, OSError) as exc:
                logger.warning("could not withdraw a waiter of %r: %r", self.name, exc)
                self._withdraw_lost(owner)

        services.holds.defer(self._keys.lock, owner, withdraw())

    # -- one attempt: send, reconcile, record ------------------------------------------------

    async def acquire_as(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None
    ) -> Hold | float:
        """One attempt for ``owner``, resolved by the caller (composites run parts at once, in
        tasks of their own, on behalf of the calling task): the hold, or the seconds to wait
        before the next."""
        with self._single_try(owner):
            started = asyncio.get_running_loop().time()
            await self._services.holds.wait_pending(self._keys.lock, owner)
            granted = False
            try:
                outcome = await self._try_acquire(owner, task, lease, started)
                granted = isinstance(outcome, Hold)
                return outcome
            finally:
                if not granted:
                    self._gave_up(owner)

    async def _try_acquire(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None, started: float
    ) -> Hold | float:
        """One attempt: the hold, or seconds to wait before the next (``inf``: no bound).

        ``started``: when the acquire call began (loop time), for the wait a fresh hold took.
        """
        while True:
            try:
                outcome = await self._attempt_once(owner, task, lease, started)
            except ResponseError as error:
                if await self._after_error(owner, task, error):
                    continue
                raise
            if outcome is not None:
                return outcome

    async def _attempt_once(
        self, owner: str, task: asyncio.Task[Any] | None, lease: float | None, started: float
    ) -> Hold | float | None:
        """:meth:`_try_acquire`'s one call: send it, reconcile a grant with what the client
        knows, record it.  ``None``: it re-entered a stale hold, try again."""
        services = self._services
        loop = asyncio.get_running_loop()
        lease_s = services.watchdog_timeout if lease is None else lease
        attempt = Attempt(owner, services.owners.next_request(), lease_s, loop.time())
        reply, synced = await self._send(attempt)
        grant = self.grant_of(reply, attempt.lease_ms)
        if grant is None:
            # A resend that was refused voided its request itself: its first copy may still
            # arrive, and must not grant once the lock is free.
            counters = self._counters
            counters.refused_sent_at = max(counters.refused_sent_at, attempt.sent_at)
            return self._refusal_pause(attempt, reply)
        reconciled = await self.settlement.reconcile(attempt, grant, synced)
        if reconciled is None:
            return None
        hold = self._record(attempt, reconciled, task, started, watchdog=lease is None)
        if hold.count == 1 and hold.expires_at <= loop.time():
            # Granted past its lease by this client's clock (the request waited on a frozen
            # path): the caller gets it lost, and the server, which may hold it for a whole
            # lease from when it ran the call, gets it back now.
            self.settlement.give_back(attempt)
        return hold

    async def _send(self, attempt: Attempt) -> tuple[Any, int]:
        """Send one acquire call: its reply, and how many replicas confirmed it (with
        ``sync_replicas``).  A grant its caller never sees is undone in the background."""
        services = self._services
        call = self.attempt_call(attempt.owner, attempt.request, attempt.lease_ms)
        return await services.calls.run_synced(
            *call,
            sync=services.sync,
            orphan=lambda work: self.settlement.acquire_unknown(attempt, work),
            on_send=attempt.sending,
            mark_resends=services.resend_window_ms,
        )

    def _late_args(self, owner: str) -> tuple[str, ...]:
        """The optional ARGV of an acquire of a kind whose hold counts per owner (every lock
        kind): the owner's releases of this lock that its client resent lately, whose late
        copies the hold must refuse (``late:<ids>``, see ``common/_requests.lua``); none on
        the fault-free path.  A semaphore's permit id is an owner of one acquisition, which
        no later acquire re-enters: its attempts carry none."""
        late = self._services.holds.late_releases(self._keys.lock, owner)
        return (f"late:{','.join(map(str, late))}",) if late else ()

    def record_message_grant(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: MessageGrant,
        *,
        granted_at: float,
        counted: bool = False,
    ) -> Hold | None:
        """Record a grant a message brought (a kind's ``_accept``), its lease counted from
        ``granted_at`` (loop time, a lower bound of when the server made it); ``None`` when it
        cannot be counted on (see :func:`countable`; a ``lease=None`` hold granted for a
        capped lease is renewed early).  ``counted``: it was found countable already, and is
        recorded whatever the clock says now (a grant claimed for a thread, which was told)."""
        services = self._services
        asked = round((services.watchdog_timeout if lease is None else lease) * 1000)
        now = asyncio.get_running_loop().time()
        left = granted_at + grant.lease_ms / 1000 - now
        if not counted and not countable(grant.lease_ms, asked, watchdog=lease is None, left=left):
            return None
        attempt = Attempt(owner, grant.request, asked / 1000, granted_at)
        reply = [grant.token, 1, grant.lease_ms]
        hold = self._record(attempt, reply, task, started, watchdog=lease is None)
        if grant.lease_ms < asked:  # a lease=None hold, granted for the capped lease
            services.watchdog.renew_by(now + left / 3)
        return hold

    def _record(
        self,
        attempt: Attempt,
        reply: list[Any],
        task: asyncio.Task[Any] | None,
        started: float,
        *,
        watchdog: bool,
    ) -> Hold:
        """Register a grant with the client (and its watchdog, for a ``lease=None`` hold)."""
        services = self._services
        hold = services.holds.record_grant(
            name=self.name,
            kind=self.kind,
            registry_key=self._registry_key,
            lock_key=self._keys.lock,
            owner=attempt.owner,
            reply=reply,
            sent_at=attempt.sent_at,
            started=started,
            watchdog=watchdog,
            counters=self._counters,
            task=task,
            renew=self._renew,
            renew_keys=self._renew_keys(),
            channels=self._channels(),
        )
        if attempt.resent:
            if not hold.resent:
                hold.listeners.append(lambda: self.settlement.void_lost(hold))
            # Its first copy may still arrive, after the release.
            hold.resent.append(attempt.request)
        if hold.watchdog:
            services.watchdog.start()
        if task is not None and self._ends_with_task and hold.count == 1:
            services.holds.tie(hold, self._release_ended)
        return hold

    # -- the first try made off the loop (aiolock.sync) --------------------------------------
    #
    # A blocking caller (aiolock.sync) may send an owner's first try itself, on its own thread
    # over a blocking connection, and post the grant here: the hop to the loop thread and back
    # costs more than the call.  The call is the one :meth:`_send` would send; the record is
    # the one :meth:`_attempt_once` makes.  Off the loop, a thread calls only the methods
    # marked "from any thread" and the ones without I/O they name (``attempt_call``,
    # ``grant_of``, ``hold``): dict and attribute reads, each atomic under the GIL.

    def first_try_off_loop(
        self, owner: str, lease: float | None, now: float
    ) -> tuple[Attempt, Call] | None:
        """From any thread: the first try of ``owner`` that its caller may send itself, and
        its record (``now``: the loop's clock, ``loop.time()``, which any thread may read);
        ``None`` when the try must be the loop's: the client is closed, traces, waits for
        replicas or is a Cluster's, a call of this client waits for the lock (the wait loop
        serves its own in turn), or a fault left something on record for the owner.

        With no call of the client waiting, :meth:`attempt_call` parks nobody on a refusal.
        The caller checks that the owner has no hold the loop recorded (a re-entry), and sends
        what this returns once; then a grant that :meth:`fresh_off_loop` accepts goes to
        :meth:`record_off_loop`, an unknown outcome (or any other grant) to
        ``settlement.acquire_unknown``, and a refusal to the loop path."""
        services = self._services
        tracing = services.tracing
        if (
            services.closed
            or services.sync is not None
            or services.cluster
            or (tracing is not None and tracing.recording())
            or self._counters.contenders
            or not services.holds.quiet(self._keys.lock, owner)
        ):
            return None
        lease_s = services.watchdog_timeout if lease is None else lease
        attempt = Attempt(owner, services.owners.next_request(), lease_s, now)
        return attempt, self.attempt_call(owner, attempt.request, attempt.lease_ms)

    def fresh_off_loop(self, attempt: Attempt, grant: list[Any]) -> bool:
        """From any thread: whether ``grant`` (:meth:`grant_of` of the reply) is a fresh hold
        that :meth:`Settlement.reconcile` would record as it is (one hold, not the owner's
        last one lost), so that its caller may return at once."""
        lost = self._services.holds.lost_token(self._registry_key, attempt.owner)
        return int(grant[1]) == 1 and lost != int(grant[0])

    def record_off_loop(
        self, attempt: Attempt, grant: list[Any], waited: float, *, watchdog: bool
    ) -> Hold:
        """On the loop: record a grant that a caller's own first try got
        (:meth:`first_try_off_loop`), as :meth:`_attempt_once` records its own: the watchdog
        renews it (``watchdog``: ``lease=None``), its timer, statistics and metrics.
        ``waited``: how long the blocking call took until it read the grant (seconds), which
        the metrics record (not how late the loop runs this)."""
        now = asyncio.get_running_loop().time()
        hold = self._record(attempt, grant, None, now - waited, watchdog=watchdog)
        if hold.count == 1 and hold.expires_at <= now:
            self.settlement.give_back(attempt)  # granted past its lease: see _attempt_once
        return hold
