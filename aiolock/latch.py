"""``AsyncCountDownLatch``: wait, across clients, until N things have happened.

The count is one key (absent: zero); counting it down to zero deletes it and publishes on the
latch's channel, where every waiting task of every client is parked on one broadcast entry per
client (:class:`~aiolock._redis.pubsub.BroadcastEntry`): one message wakes them all.  A waiter looks
at the count, joins the channel, and looks again whenever it is woken (the subscription's
confirmation wakes it too, so a zero published before the subscription is not missed, and a
zero published while it looks is kept for it).  It never polls.
"""

from __future__ import annotations

import asyncio
import math

from . import _scripts
from ._core.keys import LockKeys
from ._core.services import Services
from ._core.validate import check_timeout
from ._redis.entry import BroadcastEntry

__all__ = ["AsyncCountDownLatch"]


class AsyncCountDownLatch:
    """A count shared by every client of the same Redis and ``name``; waiters wake at zero.

    Create it with :meth:`aiolock.Client.countdown_latch`::

        latch = client.countdown_latch("import:42")
        await latch.try_set_count(3)          # by whoever starts the job
        await latch.count_down()              # by each of the 3 parts, when done
        await latch.wait(timeout=60)          # True once all 3 are done

    Not a lock: it has no owner and no lease.  A latch at zero has no key in Redis.
    """

    __slots__ = ("_keys", "_services", "_waiters", "name")

    def __init__(self, services: Services, name: str) -> None:
        self._services = services
        self.name = name
        self._keys = LockKeys.build(services.key_prefix, name, "latch", cluster=services.cluster)
        self._waiters = 0  # this object's waiting tasks

    async def try_set_count(self, count: int) -> bool:
        """Set the count to ``count`` (at least 1); ``False`` if a count above 0 is set."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError(f"count must be an int, not {type(count).__name__}")
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        services = self._services.check_open()
        return bool(await services.calls.run(_scripts.LATCH_SET, (self._keys.lock,), (count,)))

    async def count_down(self) -> None:
        """Count down by one; at zero every waiter of every client wakes."""
        keys = self._keys
        await self._services.check_open().calls.run(
            _scripts.LATCH_COUNT_DOWN, (keys.lock, keys.channel), ()
        )

    async def count(self) -> int:
        """The count now (0 when none is set)."""
        calls = self._services.check_open().calls
        value = await calls.run(_scripts.READ, (self._keys.lock,), ("get",))
        return 0 if value is None else int(value)

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - the SPEC's
        """Wait until the count is 0: ``True`` then, ``False`` if ``timeout`` ran out first."""
        wait_s = None if timeout is None else check_timeout(timeout, "timeout", minimum=0)
        loop = asyncio.get_running_loop()
        deadline = math.inf if wait_s is None else loop.time() + wait_s
        if await self.count() == 0:
            return True
        pubsub = self._services.check_open().pubsub
        # Joined before looking again: a zero published while that look is in flight finds
        # this task on the entry, not parked, and leaves it a wake-up for its park.
        entry = pubsub.join(self._keys.channel, None, BroadcastEntry)
        self._waiters += 1
        try:
            if await self.count() == 0:
                return True
            while True:
                waiter = entry.park(deadline)
                try:
                    await waiter
                except asyncio.CancelledError:
                    entry.unpark(waiter)
                    raise
                entry.raise_refusal()
                self._services.check_open()
                if await self.count() == 0:
                    return True
                if loop.time() >= deadline:
                    return False
        finally:
            self._waiters -= 1
            pubsub.unreference(entry)

    def __repr__(self) -> str:
        return f"<AsyncCountDownLatch {self.name!r} [waiters:{self._waiters}]>"
