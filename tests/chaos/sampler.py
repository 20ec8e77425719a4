"""The lock keys on the servers while a chaos run goes on, sampled for the checker.

A grant that no client knows of (a reply that came too late, a cancelled call whose settlement
never gave it back) leaves its lock's key on the server with nobody to release it: the name is
blocked until the lease runs out.  No worker can see that, so the orchestrator looks: every
``period`` it scans each primary for the run's lock keys (the main key of each lock, under the
run's key prefix and the RedLocks' ones) and records which resource each belongs to, with the
scan's times in the history's clock.  The checker compares them with the holds the clients
recorded (:func:`~tests.chaos.checker.check_phase`, "lingering-key").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from aiolock._core.keys import parts_of
from aiolock.testing.embedded import EmbeddedServer

from .history import FAIR, LOCK, RW, SEMAPHORE, SPIN, KeySample
from .worker import redlock_part, redlock_prefixes

__all__ = ["KeySampler", "resource_of"]

# A key's kind segment -> the history's resource kind (see Attempt.resource).
_KINDS = {None: LOCK, "fair": FAIR, "spin": SPIN, "rw": RW, "semaphore": SEMAPHORE}


def resource_of(prefix: str, key: str) -> tuple[str, str] | None:
    """The resource (kind, name) whose main lock key ``key`` is, under the run's ``prefix``; a
    RedLock server's plain lock is ("redlock<k>", name).  ``None`` for every other key (a
    meta hash, a queue, a counter, a latch)."""
    for index, where in enumerate(redlock_prefixes(prefix)):
        parts = parts_of(where, key)
        if parts is None or parts.suffix:
            continue
        if index:
            return (redlock_part(index), parts.name) if parts.kind is None else None
        kind = _KINDS.get(parts.kind)
        return None if kind is None else (kind, parts.name)
    return None


class KeySampler:
    """Samples the lock keys of ``servers`` (a Cluster's nodes: only the primaries of the
    moment are read) every ``period`` seconds until cancelled; :attr:`samples` has them."""

    def __init__(self, servers: Sequence[EmbeddedServer], prefix: str, period: float = 0.15):
        self.prefix = prefix
        self.period = period
        self.samples: list[KeySample] = []
        self.failed = 0  # scans that a fault (a dead or paused node) made fail
        # No resends: a node that is down (killed, restarting) fails its scan at once, and is
        # asked again at the next period, on a new connection.
        self._redis = [
            Redis(
                host=server.host,
                port=server.port,
                socket_timeout=1.0,
                socket_connect_timeout=0.5,
                retry=Retry(NoBackoff(), 0),
            )
            for server in servers
        ]

    async def run(self) -> None:
        try:
            # One loop per node: a node that stalls does not hold back the others' samples.
            await asyncio.gather(*(self._watch(redis) for redis in self._redis))
        finally:
            for redis in self._redis:
                with contextlib.suppress(RedisError, OSError):
                    await redis.aclose()

    async def _watch(self, redis: Redis) -> None:
        while True:
            await self._scan(redis)
            await asyncio.sleep(self.period)

    async def _scan(self, redis: Redis) -> None:
        try:
            role = await redis.execute_command("ROLE")  # type: ignore[no-untyped-call]
            if role[0] != b"master":
                return
            sent = time.monotonic_ns()
            found = []
            async for key in redis.scan_iter(match=f"{self.prefix}*", count=1000):
                resource = resource_of(self.prefix, key.decode("utf-8", "surrogateescape"))
                if resource is not None:
                    found.append((key, resource))
            if not found:
                return
            seconds, micros = await redis.time()
            now = seconds * 1000 + micros // 1000
            async with redis.pipeline(transaction=False) as pipe:
                for key, (kind, _) in found:
                    pipe.pttl(key)
                    if kind == SEMAPHORE:  # a permit set lives on past its leases' ends
                        pipe.zcount(key, f"({now}", "+inf")
                replies = iter(await pipe.execute())
            read = time.monotonic_ns()
        except (TimeoutError, RedisError, OSError):
            self.failed += 1
            return
        for key, (kind, name) in found:
            pttl = next(replies)
            live = next(replies) if kind == SEMAPHORE else 1
            if pttl == -2 or not live:
                continue  # gone since the scan, or a permit set with no live permit
            self.samples.append(
                KeySample(kind, name, sent, read, pttl, key.decode(errors="replace"))
            )
