"""One call for all of a client's parked fair waiters in one Cluster slot: its alive key.

Their places are kept by their client, not by tries: one alive key per client (and Cluster
slot), set for ``fair_wait_timeout`` every half of it by one call (``keep.lua``,
:class:`AliveKey`) while the client has parked waiters there, whatever their number and locks.
A waiter past its try's deadline whose client's key is gone has vanished, and is dropped once
it is next.  The same call looks at the locks that are due
(:class:`~aiolock.fair.watch.QueueWatch`, one per lock name).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .. import _scripts
from .._core.services import Services
from .._redis.tasks import supervise

if TYPE_CHECKING:
    from .watch import QueueWatch

__all__ = ["AliveKey"]

logger = logging.getLogger("aiolock.lock")


class AliveKey:
    """Keeps all the fair waiters of this client in one Cluster slot (one server) in line.

    While any of them is parked, one call (``keep.lua``) every half of ``fair_wait_timeout``
    sets the client's alive key for the timeout: it keeps every waiter of the client live in
    every queue of the slot, so a parked waiter costs the server nothing.  The same call looks
    at the locks that are due (:class:`~aiolock.fair.watch.QueueWatch`), and once every
    other timeout or so checks that their queues still have this client's owners and re-arms
    their expiry.  If the key
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
        self._members: dict[QueueWatch, None] = {}  # the locks with parked waiters, in order
        self._task: asyncio.Task[None] | None = None  # the loop, while it runs
        # Done to have the loop, sleeping until loop time _wake_at, look again sooner.
        self._wake: asyncio.Future[None] | None = None
        self._wake_at = math.inf
        self._tick_at = math.inf  # the next refresh of the alive key (loop time)
        self._retry_at = 0.0  # after a failed call: no call before then
        self._written = False  # the key should exist: set, and not deleted since

    def join(self, member: QueueWatch) -> None:
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

    def leave(self, member: QueueWatch) -> None:
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

    async def _run(self, members: list[QueueWatch], *, gone: bool) -> None:
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

    def _kept(self, members: list[QueueWatch], counted: list[bool], reply: Any) -> None:
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


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
