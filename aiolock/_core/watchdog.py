"""One renewal task per client: keeps ``lease=None`` holds alive while their owners hold them.

Every ``watchdog_timeout / 3`` it renews all watched holds, one script call per batch; a batch
holds holds of one kind (each kind renews with its own script).  A hold
whose lock is gone or owned by someone else is marked lost at once.  A renewal that fails (the
connection dropped) is retried quickly; a hold whose lease runs out meanwhile is marked lost by
its timer, because from then on nobody can say who holds the lock.  A lock whose owning task
ended holding it is released by the client (``Holds.tie``); a permit whose task ended is
dropped, and expires within one lease.

The batches of a round run concurrently, each retrying on its own: on a Cluster a batch whose
node is dead (until its replica takes over) must not hold up the renewals of the other nodes'
holds.  A batch still retrying when the next round comes is not started twice: it takes that
round's holds for its next try.  A round reads the registry and groups the holds once, and each
group's task is handed its own holds: on a Cluster there are about as many groups as holds (one
per slot), and a task that regrouped every hold would make a round cost their square.

With ``sync_replicas``, a renewal waits (``WAIT``) for the replicas as a grant does, and one
they do not confirm in time extends nothing and is retried: a failover to a replica that never
had it forgets it, and the lock then ends there when the last renewal the replica had says.
Counting on it would let the holder believe in a hold that another client can be granted on
the promoted replica.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from redis.crc import key_slot
from redis.exceptions import RedisError

from .._redis.calls import Runner
from .._redis.tasks import supervise
from .holds import Hold, Holds
from .metrics import lock_extra

__all__ = ["Watchdog"]

logger = logging.getLogger("aiolock.watchdog")

_BATCH = 500  # holds per renewal script call: bounds how long one call blocks the server
_RENEWED = {1: True, 0: False}


class Watchdog:
    """Renews the watched holds of :class:`~aiolock._core.holds.Holds` (see the module doc)."""

    def __init__(
        self,
        calls: Runner,
        holds: Holds,
        *,
        lease: float,
        per_slot: bool = False,
        sync: tuple[int, float] | None = None,
    ) -> None:
        self._calls = calls
        self._per_slot = per_slot  # a Cluster: one script call may only touch keys of one slot
        self._sync = sync  # (replicas, seconds) each renewal waits for, as grants do
        self._holds = holds
        self.lease = lease
        self.period = lease / 3
        self._task: asyncio.Task[None] | None = None
        self._renewing: dict[_Group, asyncio.Task[None]] = {}
        # The holds of a later round for a group still retrying: its next try takes them.
        self._due: dict[_Group, list[Hold]] = {}
        self._early: asyncio.TimerHandle | None = None  # a round due before the next period
        self.renewals = 0
        self.failures = 0

    def start(self) -> None:
        """Start the renewal task if it is not running (called when a watched hold appears)."""
        if self._task is None or self._task.done():
            self._task = supervise("aiolock-watchdog", self._run)

    def renew_by(self, when: float) -> None:
        """A watched hold's lease ends sooner than the next round may come (a fair lock's
        grant from the queue, whose lease is at most the wait timeout): one round starts at
        loop time ``when`` at the latest."""
        if self._early is not None:
            if self._early.when() <= when:
                return
            self._early.cancel()
        self._early = asyncio.get_running_loop().call_at(when, self._early_round)

    def _early_round(self) -> None:
        self._early = None
        self._start_round()

    async def aclose(self) -> None:
        if self._early is not None:
            self._early.cancel()
            self._early = None
        tasks = [*self._renewing.values()]
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._due.clear()

    async def _run(self) -> None:
        while True:
            if not self._holds.watched():
                self._holds.changed.clear()
                await self._holds.changed.wait()
            # A grant has just set the full lease: the first renewal is one period later.
            await asyncio.sleep(self.period)
            self._start_round()

    async def renew_once(self) -> None:
        """One renewal round over every watched hold, retrying failures within the lease."""
        await asyncio.gather(*self._start_round())

    def _start_round(self) -> list[asyncio.Task[None]]:
        """Start renewing every group of watched holds that is not being renewed already; a
        group still retrying takes this round's holds for its next try."""
        started = []
        loop = asyncio.get_running_loop()
        for group, holds in _groups(self._alive(), per_slot=self._per_slot).items():
            if group in self._renewing:
                self._due[group] = holds
                continue
            task = loop.create_task(self._renew_group(group, holds))
            self._renewing[group] = task
            task.add_done_callback(functools.partial(self._renewed, group))
            started.append(task)
        return started

    def _renewed(self, group: _Group, task: asyncio.Task[None]) -> None:
        if self._renewing.get(group) is task:
            del self._renewing[group]
            self._due.pop(group, None)  # renewed since: the next round takes them afresh
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("watchdog renewal stopped by a bug", exc_info=error)

    def _alive(self) -> list[Hold]:
        return [hold for hold in self._holds.watched() if self._owner_alive(hold)]

    def _renewable(self, hold: Hold) -> bool:
        """Whether ``hold`` is still the registry's, and its owner alive (no I/O, O(1))."""
        return self._holds.get(hold.registry_key, hold.owner) is hold and self._owner_alive(hold)

    async def _renew_group(self, group: _Group, holds: list[Hold]) -> None:
        """Renew one group's ``holds``, retrying failures within the lease."""
        delay = min(0.05, self.period / 10)
        while True:
            # Checked again on every try: holds lost, released or ended since are left out,
            # and those granted since come with the next round (see _start_round).
            holds = [hold for hold in self._due.pop(group, holds) if self._renewable(hold)]
            if not holds:
                return
            try:
                for start in range(0, len(holds), _BATCH):
                    await self._renew(holds[start : start + _BATCH])
                return
            except (RedisError, OSError, _Unconfirmed) as exc:
                # Retried within the lease; each hold's timer marks it lost if the lease runs
                # out before a renewal lands.
                self.failures += 1
                logger.warning("watchdog renewal failed, retrying: %r", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.period / 3)

    async def _renew(self, holds: list[Hold]) -> None:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()

        def sending(resend: bool) -> None:
            # The renewed lease runs from when the server ran the copy that answered, written
            # now: a reconnect or a retry's backoff before it must not eat into it.
            nonlocal sent_at
            sent_at = loop.time()

        keys = tuple(key for hold in holds for key in hold.renew_keys)
        args = (round(self.lease * 1000), *(hold.owner for hold in holds))
        sync, unconfirmed = self._sync, ""
        replies, replicas = await self._calls.run_synced(
            holds[0].renew, keys, args, sync=sync, on_send=sending
        )
        if sync is not None and replicas < sync[0]:
            unconfirmed = (
                f"{replicas} of the {sync[0]} replica(s) asked for confirmed the renewal of "
                f"{len(holds)} hold(s) within {sync[1]}s"
            )
        for hold, reply in zip(holds, replies, strict=True):
            # The recorded verdict, not the clock's: a renewal read after the deadline (a busy
            # loop) still proves that the lease never ran out on the server.
            if hold.lost or self._holds.get(hold.registry_key, hold.owner) is not hold:
                continue  # released or replaced while the call was in flight
            if not _RENEWED[int(reply)]:
                if self._holds.in_release(hold):
                    continue  # the owner's own release may have ended it: its reply tells
                self._holds.lose(hold, "the watchdog found it expired or held by another owner")
            elif not unconfirmed:
                self._holds.renewed(hold, sent_at, self.lease)  # counts the hold's renewal
                self.renewals += 1
        if unconfirmed:
            raise _Unconfirmed(unconfirmed)

    def _owner_alive(self, hold: Hold) -> bool:
        if hold.task is None or not hold.task.done():
            return True
        if hold.tied:
            return False  # the client is releasing it (Holds.tie)
        # The owning task ended without releasing: stop renewing so the lock expires.
        logger.warning(
            "task %s ended while holding lock %r; its lease runs out in at most %.1fs",
            hold.task.get_name(),
            hold.name,
            self.lease,
            extra=lock_extra(hold.kind, hold.name, hold.owner),
        )
        self._holds.forget(hold)
        return False


class _Unconfirmed(Exception):
    """Fewer replicas than ``sync_replicas`` confirmed a renewal in time: it extends nothing."""


_Group = tuple[str, int]
"""Holds renewed by one script (its SHA), in one Cluster slot (0 on one server)."""


def _groups(holds: list[Hold], *, per_slot: bool) -> dict[_Group, list[Hold]]:
    """Holds grouped by renew script (and by Cluster slot)."""
    groups: dict[_Group, list[Hold]] = {}
    for hold in holds:
        slot = key_slot(hold.renew_keys[0].encode()) if per_slot else 0
        groups.setdefault((hold.renew.sha, slot), []).append(hold)
    return groups
