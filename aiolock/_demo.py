"""The seeds' scenario: 100 users try to join a group limited to 5 members at the same moment.

Each request checks the group's size and adds its user under ``acquire(wait=5, lease=3)``,
the add through ``guard.transaction()`` (it lands only while the lock is held); the group
lives in Redis, so the requests may come from several processes.  With the lock exactly 5
join; ``--no-lock`` runs the same check-then-add without it and shows the race it prevents.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from redis.asyncio import Redis, RedisCluster

from .client import Client
from .errors import LockLostError, LockTimeoutError

__all__ = ["demo", "join_group", "run", "run_requests"]

LIMIT = 5


async def join_group(
    client: Client, redis: Redis | RedisCluster, group: str, user: str, *, locked: bool
) -> str:
    """One request: ``joined``, ``refused`` (the group is full), ``timeout`` (no lock in time)
    or ``lost`` (the lease ran out before the add, which was refused).

    Under the lock the member is added through ``guard.transaction()``: the write lands only if
    the request still holds the lock, so a request paused past its lease (another one may have
    filled the group meanwhile) cannot add a sixth member.
    """
    lock = client.lock(group)
    members = f"{lock.hash_tag}:members"  # in the lock's slot, as a transaction on a Cluster needs

    async def full() -> bool:
        if await redis.scard(members) >= LIMIT:
            return True
        await asyncio.sleep(0)  # the gap between check and write where the race lives
        return False

    if not locked:
        if await full():
            return "refused"
        await redis.sadd(members, user)
        return "joined"
    try:
        async with lock.acquire(wait=5, lease=3) as guard:
            if await full():
                return "refused"
            async with guard.transaction() as tx:
                tx.sadd(members, user)
            return "joined"
    except LockTimeoutError:
        return "timeout"
    except LockLostError:
        return "lost"  # paused past its lease: the transaction refused its add


async def run_requests(url: str, group: str, users: Sequence[str], *, locked: bool) -> Counter[str]:
    """Send one concurrent request per user; count the outcomes."""
    async with Client.from_url(url) as client:
        redis = client.redis
        outcomes = await asyncio.gather(
            *(join_group(client, redis, group, user, locked=locked) for user in users)
        )
    return Counter(outcomes)


def _run_in_process(url: str, group: str, users: list[str], locked: bool) -> Counter[str]:
    return asyncio.run(run_requests(url, group, users, locked=locked))


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from .testing.embedded import EmbeddedServer

    with EmbeddedServer() as server:
        yield server.url


def demo(
    url: str,
    *,
    requests: int,
    processes: int,
    locked: bool,
    progress: Callable[[int, int], object] | None = None,
) -> Counter[str]:
    """Run the scenario on the server at ``url``; ``progress(done, processes)`` is called as
    each process finishes (with more than one)."""
    group = f"demo-group-{uuid.uuid4().hex[:8]}"
    users = [f"user-{i}" for i in range(requests)]
    if processes <= 1:
        return asyncio.run(run_requests(url, group, users, locked=locked))
    shares = [users[i::processes] for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    total: Counter[str] = Counter()
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        parts = [pool.submit(_run_in_process, url, group, share, locked) for share in shares]
        for done, part in enumerate(as_completed(parts), 1):
            total += part.result()
            if progress is not None:
                progress(done, processes)
    return total


def run(
    url: str | None,
    *,
    requests: int = 100,
    processes: int = 1,
    locked: bool = True,
    progress: Callable[[str], object] = print,
) -> int:
    """``aiolock demo``: run the scenario and print its outcome; the exit code (1: it failed).

    ``url=None`` starts an embedded server for the run.  ``progress`` gets a line for each
    step of the longer runs (starting the server, each process done).
    """
    if url is None:
        progress("starting an embedded server...")
    with _server(url) as server_url:
        if processes > 1:
            progress(f"sending {requests} requests from {processes} processes...")
        started = time.perf_counter()
        outcomes = demo(
            server_url,
            requests=requests,
            processes=processes,
            locked=locked,
            progress=lambda done, total: progress(f"  {done}/{total} processes done"),
        )
        elapsed = time.perf_counter() - started
    mode = "with the lock" if locked else "WITHOUT the lock"
    print(
        f"{requests} requests to join a group limited to {LIMIT}, {mode}, "
        f"from {processes} process(es):"
    )
    for outcome in ("joined", "refused", "timeout", "lost"):
        if outcome != "lost" or outcomes[outcome]:
            print(f"  {outcome:8} {outcomes[outcome]:4}")
    print(f"  wall time {elapsed:.3f}s")
    if locked and outcomes["joined"] != LIMIT:
        print(f"FAILED: {outcomes['joined']} joined, expected {LIMIT}")
        return 1
    if not locked and outcomes["joined"] > LIMIT:
        print(f"the race let {outcomes['joined'] - LIMIT} extra users in")
    return 0
