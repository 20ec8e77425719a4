"""The seeds' scenario: 100 users try to join a group limited to 5 members at the same moment.

Each request checks the group's size and adds its user under ``try_lock(wait=5, lease=3)``; the
group lives in Redis, so the requests may come from several processes.  With the lock exactly 5
join; ``--no-lock`` runs the same check-then-add without it and shows the race it prevents.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from redis.asyncio import Redis

from .client import Client

__all__ = ["join_group", "main", "run_requests"]

LIMIT = 5


async def join_group(client: Client, redis: Redis, group: str, user: str, *, locked: bool) -> str:
    """One request: ``joined``, ``refused`` (the group is full) or ``timeout`` (no lock in time)."""
    members = f"{group}:members"

    async def check_then_add() -> str:
        if await redis.scard(members) >= LIMIT:
            return "refused"
        await asyncio.sleep(0)  # the gap between check and write where the race lives
        await redis.sadd(members, user)
        return "joined"

    if not locked:
        return await check_then_add()
    lock = client.lock(group)
    if not await lock.try_lock(wait=5, lease=3):
        return "timeout"
    try:
        return await check_then_add()
    finally:
        await lock.unlock()


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
    from .embedded import EmbeddedServer

    with EmbeddedServer() as server:
        yield server.url


def demo(url: str, *, requests: int, processes: int, locked: bool) -> Counter[str]:
    group = f"demo-group-{uuid.uuid4().hex[:8]}"
    users = [f"user-{i}" for i in range(requests)]
    if processes <= 1:
        return asyncio.run(run_requests(url, group, users, locked=locked))
    shares = [users[i::processes] for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        parts = pool.map(
            _run_in_process, [url] * processes, [group] * processes, shares, [locked] * processes
        )
        return sum(parts, Counter())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiolock", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("demo", help="100 users join a group limited to 5")
    run.add_argument("--url", help="a Redis URL (default: start an embedded server)")
    run.add_argument("--requests", type=int, default=100, help="concurrent requests (100)")
    run.add_argument("--processes", type=int, default=1, help="spread them over N processes")
    run.add_argument("--no-lock", action="store_true", help="skip the lock to show the race")
    args = parser.parse_args(argv)

    locked = not args.no_lock
    with _server(args.url) as url:
        started = time.perf_counter()
        outcomes = demo(url, requests=args.requests, processes=args.processes, locked=locked)
        elapsed = time.perf_counter() - started
    mode = "with the lock" if locked else "WITHOUT the lock"
    print(
        f"{args.requests} requests to join a group limited to {LIMIT}, {mode}, "
        f"from {args.processes} process(es):"
    )
    for outcome in ("joined", "refused", "timeout"):
        print(f"  {outcome:8} {outcomes[outcome]:4}")
    print(f"  wall time {elapsed:.3f}s")
    if locked and outcomes["joined"] != LIMIT:
        print(f"FAILED: {outcomes['joined']} joined, expected {LIMIT}")
        return 1
    if not locked and outcomes["joined"] > LIMIT:
        print(f"the race let {outcomes['joined'] - LIMIT} extra users in")
    return 0
