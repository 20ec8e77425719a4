"""``names``: many lock names, each taken and released at once (a lock per entity).

P processes x T tasks (4 x 64; 4 x 16 with ``--quick``) loop for a window of 5 s (1 s): pick
one of 10,000 names at random (under a prefix unique to the run), acquire it (waiting as long
as it takes), release it at once (no hold) and count the cycle; only cycles that start inside
the window count.  A task makes the lock object anew every cycle (``client.lock(name)``,
redis-py's ``Lock(redis, name)``), as code that locks per entity does.  Before the window every
task takes and releases one name of the run, so its connections are open.

Figures per run: cycles/s; the names used (distinct names cycled in the window); the acquire
call's p50/p99 (the lock object included); overlaps (a grant of a name before the previous
hold's release timestamp: must be 0; with no hold the check only catches gross breakage); the
server's commands per cycle (``INFO`` ``total_commands_processed``, which counts the commands
scripts run too) and its CPU per cycle, the worker processes' CPU per cycle; and the keys the
run left in the server:

- ``keys_left``: once every worker has closed its clients after the window, the keys whose name
  carries the run's prefix (redis-py's lock key is the name; aiolock's are ``bench:{name}``,
  ``bench:{name}:meta``, the fair lock's also ``bench:fair:{name}:q`` and ``:qa``), plus, for
  the aiolock kinds, the keys of the key prefix that carry no name (``bench:fence``: one
  fencing counter for every name);
- ``keys_max_ttl_s``: the longest TTL among them (aiolock's resend markers live as long as the
  lease a lock had left, up to the 30 s watchdog lease);
- ``keys_settled``: once every run is over, the scenario waits until the keys of all its runs
  that have a TTL are gone (``settled_after_s`` past the last window, at most 60 s), then
  counts each run's keys again: what stays for good;
- ``dbsize_delta``: ``DBSIZE`` right after, minus ``DBSIZE`` before the run (keys of earlier
  runs that expire meanwhile shift it).

Keys are also given per 10,000 names (``*_per_10k_names``): the target is a flat keyspace,
whatever the number of names.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from typing import Any

from aiolock._core.keys import fence_of

from ..impls import IMPLS, KEY_PREFIX, AiolockImpl, make
from ..stats import ServerProbe, median_of_runs, percentile
from ..workers import WorkerPool
from . import rotated
from .cluster import _overlaps

__all__ = ["NAMED", "NAMES", "cycle_names", "run"]

NAMES = 10_000
PROCESSES = 4
TASKS = 64
DURATION_S = 5.0
SETTLE_S = 60.0  # the longest wait for the keys with a TTL to expire, after the last run
NAMED = ("aiolock", "aiolock-fair", "redispy-0.001")
_SETUP_S = 1.5  # from sending the jobs to the start of the window


def _name(prefix: str, index: int) -> str:
    return f"{prefix}:{index}"


async def cycle_names(
    *,
    impl: str,
    url: str,
    prefix: str,
    tasks: int,
    start_ns: int,
    end_ns: int,
    first_worker: int,
    seed: int,
) -> dict[str, Any]:
    """One process's share: ``tasks`` tasks cycling random names from ``start_ns`` to
    ``end_ns``; logs ``(started, granted, released, name)`` per cycle."""
    lock_impl = make(impl, url, concurrency=tasks)
    await lock_impl.open()
    rng = random.Random(seed)
    records: list[tuple[int, int, int, int]] = []

    async def once(index: int) -> None:
        handle = lock_impl.handle(_name(prefix, index))
        await handle.acquire()
        await handle.release()

    async def worker() -> None:
        while (started := time.perf_counter_ns()) < end_ns:
            index = rng.randrange(NAMES)
            handle = lock_impl.handle(_name(prefix, index))
            await handle.acquire()
            granted = time.perf_counter_ns()
            released = time.perf_counter_ns()
            await handle.release()
            records.append((started, granted, released, index))

    try:
        # Warm up: every task opens its connection on a name of its own (one of the run's).
        await asyncio.gather(*(once(first_worker + i) for i in range(tasks)))
        late_ns = max(0, time.perf_counter_ns() - start_ns)
        await asyncio.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
        cpu_ns = time.process_time_ns()
        running = [asyncio.create_task(worker()) for _ in range(tasks)]
        await asyncio.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
        cpu_ns = time.process_time_ns() - cpu_ns
        # No hold: the cycles under way end at once, unless a name is contended.
        _, pending = await asyncio.wait(running, timeout=5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        await asyncio.wait_for(lock_impl.aclose(), timeout=10)
    return {"records": records, "late_ns": late_ns, "cpu_ns": cpu_ns}


def _keys_left(probe: ServerProbe, prefix: str, aiolock_kind: bool) -> list[int]:
    """The TTLs (ms, -1: none) of the keys the run left: those that carry its names, and for
    aiolock the key prefix's keys that carry none (the fencing counter)."""
    ttls = probe.key_ttls(f"*{prefix}:*")
    if aiolock_kind:
        ttls += probe.key_ttls(f"{fence_of(KEY_PREFIX)}*")
    return ttls


def _one_run(
    pool: WorkerPool,
    probe: ServerProbe,
    *,
    impl: str,
    url: str,
    tasks: int,
    duration_s: float,
) -> dict[str, Any]:
    prefix = f"bench:names:{uuid.uuid4().hex[:12]}"
    aiolock_kind = issubclass(IMPLS[impl], AiolockImpl)
    dbsize_before = probe.dbsize()
    start_ns = time.perf_counter_ns() + int(_SETUP_S * 1e9)
    end_ns = start_ns + int(duration_s * 1e9)
    jobs = [
        (
            cycle_names,
            {
                "impl": impl,
                "url": url,
                "prefix": prefix,
                "tasks": tasks,
                "start_ns": start_ns,
                "end_ns": end_ns,
                "first_worker": index * tasks,
                "seed": index,
            },
        )
        for index in range(len(pool))
    ]
    pool.send(jobs)
    time.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
    before = probe.sample()
    time.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
    commands, server_cpu_s, _ = before.delta(probe.sample())
    replies = pool.gather(timeout=_SETUP_S + duration_s + 30)
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        return {"error": errors[0]}

    counted_ns = time.perf_counter_ns()
    left = _keys_left(probe, prefix, aiolock_kind)
    dbsize_delta = probe.dbsize() - dbsize_before

    cycles = [tuple(r) for reply in replies for r in reply["records"] if start_ns <= r[0] < end_ns]
    count = max(1, len(cycles))
    client_cpu_ns = sum(reply["cpu_ns"] for reply in replies)
    result: dict[str, Any] = {
        "cycles": len(cycles),
        "cycles_per_s": len(cycles) / duration_s,
        "names_used": len({c[3] for c in cycles}),
        "acquire_p50_us": percentile([c[1] - c[0] for c in cycles], 50) / 1e3,
        "acquire_p99_us": percentile([c[1] - c[0] for c in cycles], 99) / 1e3,
        "overlaps": _overlaps([(c[1], c[2], c[3]) for c in cycles]),
        "commands_per_cycle": commands / count,
        "server_cpu_us_per_cycle": server_cpu_s / count * 1e6,
        "client_cpu_us_per_cycle": client_cpu_ns / count / 1e3,
        "late_start_ms": max(reply["late_ns"] for reply in replies) / 1e6,
        "keys_counted_after_s": (counted_ns - end_ns) / 1e9,
        "keys_left": len(left),
        "keys_left_per_10k_names": len(left) * 10_000 / NAMES,
        "keys_max_ttl_s": max(left, default=0) / 1e3,
        "dbsize_delta": dbsize_delta,
        "prefix": prefix,
        "end_ns": end_ns,
    }
    if result["late_start_ms"] > 0:
        print(
            f"[bench] names, {impl}: the slowest process warmed up "
            f"{result['late_start_ms']:.0f} ms into the window",
            file=sys.stderr,
        )
    return result


def _settle(probe: ServerProbe, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Wait until the keys with a TTL of every run are gone, then count what each run left."""
    done = [(name, r) for name, rs in runs.items() for r in rs if "error" not in r]
    if not done:
        return
    last_ns = max(r["end_ns"] for _, r in done)
    deadline = time.perf_counter() + SETTLE_S
    while True:
        left = {
            id(r): _keys_left(probe, r["prefix"], issubclass(IMPLS[n], AiolockImpl))
            for n, r in done
        }
        expiring = sum(1 for ttls in left.values() for ttl in ttls if ttl != -1)
        if expiring == 0 or time.perf_counter() > deadline:
            break
        time.sleep(1.0)
    settled_after_s = (time.perf_counter_ns() - last_ns) / 1e9
    for _, r in done:
        ttls = left[id(r)]
        r["keys_settled"] = len(ttls)
        r["keys_settled_per_10k_names"] = len(ttls) * 10_000 / NAMES
        r["keys_settled_expiring"] = sum(1 for ttl in ttls if ttl != -1)
        r["settled_after_s"] = settled_after_s


def run(
    url: str,
    impls: list[str],
    *,
    repeats: int,
    quick: bool,
    processes: int = PROCESSES,
    tasks: int = TASKS,
    duration_s: float = DURATION_S,
) -> dict[str, Any]:
    """The implementations of ``impls`` that are in :data:`NAMED`, in their order."""
    if quick:
        tasks, duration_s = 16, 1.0
    names = [name for name in impls if name in NAMED]
    probe = ServerProbe(url)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        with WorkerPool(processes) as pool:
            pool.wait_ready()
            for repeat in range(repeats):
                for name in rotated(names, repeat):
                    runs[name].append(
                        _one_run(
                            pool, probe, impl=name, url=url, tasks=tasks, duration_s=duration_s
                        )
                    )
        _settle(probe, runs)
    finally:
        probe.close()
    return {
        "names": NAMES,
        "processes": processes,
        "tasks_per_process": tasks,
        "duration_s": duration_s,
        "impls": {n: {"runs": r, "median": median_of_runs(r)} for n, r in runs.items()},
    }
