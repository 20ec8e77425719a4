"""``cluster``: 1,000 distinct locks contended by 4 processes against a 3-primary Cluster.

The scenario starts its own :class:`~aiolock.testing.embedded.EmbeddedCluster` (3 primaries, no
replicas, of the ``--server`` binary) on this machine.  Every process runs T tasks; each task
loops: pick one of the 1,000 lock names at random, acquire it (waiting as long as it takes),
hold it 1 ms, release it, and log ``(granted, released, lock)`` with ``perf_counter_ns``.  The
names spread over the slots, so over the three nodes.

Compared in the same run, on the same cluster: ``aiolock`` (``Client(RedisCluster)``, the
watchdog lease) and redis-py's ``Lock`` through ``RedisCluster`` with ``sleep=0.001`` (SET NX
PX, a 1 ms poll, a Lua release).  Figures: acquisitions/s; served (tasks that acquired at least
once); overlaps (two holds of one lock at once: must be 0); and per node, from ``INFO`` over the
window: its share of the acquisitions (by the slots of the locks), its server CPU per
acquisition of its own locks, and its commands per acquisition.

Free-running, each implementation runs as fast as its clients go: on a machine whose cores the
clients and the nodes share, a client that costs more CPU per acquisition runs fewer a second,
and a node then reads fewer commands per wake-up, so its CPU per acquisition rises with no more
work per acquisition (redis-py's own moved from 85 to 210 µs between 3,300 and 600 acquisitions
a second, measured).  The tasks also hold longer on a saturated machine, so more acquisitions
find their lock held.  So every implementation then runs again **paced**: its processes start
acquisitions at one common rate (``rate``, by default 3/4 of the lowest free-running rate of the
run), and the nodes' CPU per acquisition is compared at one load.

``--impls`` may also name two floors (:data:`FLOORS`, not run by default), the servers' side of
two designs with no client logic and redis-py's 1 ms poll for waits: ``floor-script`` runs
aiolock's acquire script with a fault-free call's arguments (so its fast path) and its plain
``HDEL`` release; ``floor-string`` a string lock that draws a fencing token with every try
(``MULTI``, ``INCR`` of the counter, ``SET NX PX``, ``EXEC``; the client keeps the token) and
redis-py's release script.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

from redis.asyncio import RedisCluster
from redis.asyncio.lock import Lock as RedisPyLock
from redis.crc import key_slot

import aiolock
from aiolock._core.keys import LockKeys
from aiolock._scripts import LOCK_ACQUIRE
from aiolock.lock import command_release_fields
from aiolock.testing.embedded import EmbeddedCluster

from ..stats import ServerProbe, median_of_runs
from ..workers import WorkerPool
from . import rotated

__all__ = ["IMPLS", "contend", "run"]

HOLD_S = 0.001
WARM_NAMES = 6  # names each task locks before the window, to open its connections
LOCKS = 1000
PROCESSES = 4
TASKS = 64
IMPLS = ("aiolock", "redispy-0.001")
# Not aiolock, and not run unless asked (``--impls``): the server's side of two designs, with
# no client logic and redis-py's 1 ms poll for waits (the cheapest wait for the server here).
FLOORS = ("floor-script", "floor-string")
LABELS = {
    "aiolock": "aiolock lock",
    "redispy-0.001": "redis-py Lock sleep=0.001",
    "floor-script": "floor: aiolock's fault-free script + HDEL, 1 ms poll",
    "floor-string": "floor: MULTI INCR + SET NX PX, release script, 1 ms poll",
}

# A string lock's release: redis-py's compare-and-delete of the value its acquire set.
_FLOOR_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def _key(run_id: str, index: int) -> str:
    """The name of lock ``index`` (aiolock's keys hash by the name: same spread)."""
    return f"bench:cluster:{run_id}:{index}"


async def _open(
    impl: str, url: str, tasks: int
) -> tuple[Callable[[str], tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]], Any]:
    """A factory of (acquire, release) per name, and what to close afterwards."""
    redis = RedisCluster.from_url(url, max_connections=2 * tasks)
    await redis.initialize()
    if impl == "aiolock":
        client = aiolock.Client(redis, key_prefix="bench")

        def aiolock_pair(name: str) -> tuple[Any, Any]:
            lock = client.lock(name)
            return lock.lock, lock.unlock

        async def close_aiolock() -> None:
            await client.aclose()
            await redis.aclose()

        return aiolock_pair, close_aiolock

    if impl in FLOORS:
        return _floor(redis, impl), redis.aclose

    def redispy_pair(name: str) -> tuple[Any, Any]:
        lock = RedisPyLock(redis, name, timeout=60, sleep=0.001)
        return lock.acquire, lock.release

    return redispy_pair, redis.aclose


def _floor(redis: RedisCluster, impl: str) -> Callable[[str], Any]:
    """The (acquire, release) factory of a floor design (see :data:`FLOORS`)."""
    client = uuid.uuid4().hex
    # aiolock's own acquire script, with the fault-free call's four ARGV (its fast path).
    acquire_script = redis.register_script(LOCK_ACQUIRE.source)
    release_script = redis.register_script(_FLOOR_RELEASE)
    requests = iter(range(1, 1 << 62))

    def pair(name: str) -> tuple[Any, Any]:
        keys = LockKeys.build("bench", name, cluster=True)
        task = asyncio.current_task()
        owner = f"{client}:t{id(task)}"
        value = ""

        async def acquire_hash() -> None:
            while True:
                reply = await acquire_script(
                    keys=[keys.lock, keys.meta, keys.fence],
                    args=[60_000, owner, next(requests), 0],
                )
                if isinstance(reply, int):  # the token: granted
                    return
                await asyncio.sleep(0.001)

        async def release_hash() -> None:
            await redis.hdel(keys.lock, *command_release_fields(owner))

        async def acquire_string() -> None:
            nonlocal value
            while True:
                pipe = redis.pipeline(transaction=True)
                pipe.incr(keys.fence)
                value = f"{owner}/{next(requests)}"
                pipe.set(keys.lock, value, nx=True, px=60_000)
                _, granted = await pipe.execute()
                if granted:
                    return
                await asyncio.sleep(0.001)

        async def release_string() -> None:
            await release_script(keys=[keys.lock], args=[value])

        if impl == "floor-script":
            return acquire_hash, release_hash
        return acquire_string, release_string

    return pair


async def contend(
    *,
    impl: str,
    url: str,
    run_id: str,
    tasks: int,
    start_ns: int,
    end_ns: int,
    seed: int,
    rate: float | None = None,
) -> dict[str, Any]:
    """One process's share: ``tasks`` tasks on random locks from ``start_ns`` to ``end_ns``."""
    pair, close = await _open(impl, url, tasks)
    rng = random.Random(seed)
    # ``rate``: acquisitions per second this process starts at most (one every 1/rate s, in
    # order), so that implementations are compared at the same load.
    next_start = 0.0

    async def paced() -> None:
        nonlocal next_start
        if rate is None:
            return
        loop = asyncio.get_running_loop()
        next_start = max(next_start + 1 / rate, loop.time())
        await asyncio.sleep(next_start - loop.time())

    records: list[tuple[int, int, int]] = []
    holding: set[int] = set()
    served: set[int] = set()

    async def worker(index: int) -> None:
        while time.perf_counter_ns() < end_ns:
            await paced()
            lock = rng.randrange(LOCKS)
            acquire, release = pair(_key(run_id, lock))
            await acquire()
            granted = time.perf_counter_ns()
            holding.add(index)
            await asyncio.sleep(HOLD_S)
            released = time.perf_counter_ns()
            await release()
            holding.discard(index)
            records.append((granted, released, lock))
            if granted >= start_ns:
                served.add(index)

    try:
        # Warm up: open the connections the window will use, on private names, before it:
        # every task at once, a few names each (so every node), as in the window; the
        # server's CPU for accepting connections is no part of what a lock costs.
        async def warm(index: int) -> None:
            for round_ in range(WARM_NAMES):
                acquire, release = pair(_key(run_id, LOCKS + index * WARM_NAMES + round_))
                await acquire()
                await release()

        await asyncio.gather(*(warm(index) for index in range(tasks)))
        await asyncio.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
        running = [asyncio.create_task(worker(index)) for index in range(tasks)]
        await asyncio.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
        for index, task in enumerate(running):
            if index not in holding:
                task.cancel()
        _, pending = await asyncio.wait(running, timeout=5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        await asyncio.wait_for(close(), timeout=10)
    return {"records": records, "served": len(served)}


def _slot_of(impl: str, run_id: str, lock: int) -> int:
    key = _key(run_id, lock)
    # aiolock's keys carry the name as their hash tag; redis-py's key is the name itself.
    aiolock_keys = impl == "aiolock" or impl in FLOORS
    return key_slot(f"{{{key}}}".encode() if aiolock_keys else key.encode())


def _overlaps(records: list[tuple[int, int, int]]) -> int:
    """Grants of a lock before the previous hold of the same lock was released."""
    by_lock: dict[int, list[tuple[int, int]]] = {}
    for granted, released, lock in records:
        by_lock.setdefault(lock, []).append((granted, released))
    overlaps = 0
    for holds in by_lock.values():
        holds.sort()
        latest = None
        for granted, released in holds:
            if latest is not None and granted < latest:
                overlaps += 1
            latest = released if latest is None else max(latest, released)
    return overlaps


def _one_run(
    pool: WorkerPool,
    cluster: EmbeddedCluster,
    probes: list[ServerProbe],
    *,
    impl: str,
    duration_s: float,
    tasks: int,
    rate: float | None = None,
) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    start_ns = time.perf_counter_ns() + int(3.0 * 1e9)  # the warm-up opens many connections
    end_ns = start_ns + int(duration_s * 1e9)
    jobs = [
        (
            contend,
            {
                "impl": impl,
                "url": cluster.url,
                "run_id": run_id,
                "tasks": tasks,
                "start_ns": start_ns,
                "end_ns": end_ns,
                "seed": index,
                "rate": None if rate is None else rate / len(pool),
            },
        )
        for index in range(len(pool))
    ]
    pool.send(jobs)
    time.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
    before = [probe.sample() for probe in probes]
    time.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
    deltas = [b.delta(probe.sample()) for b, probe in zip(before, probes, strict=True)]
    replies = pool.gather(timeout=3.0 + duration_s + 60)
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        return {"error": errors[0]}
    holds = [
        (r[0], r[1], r[2])
        for reply in replies
        for r in reply["records"]
        if start_ns <= r[0] < end_ns
    ]
    acquisitions = max(1, len(holds))
    # Which node serves each slot: the primaries in order of their slot ranges.
    per = 16384 // len(cluster.primaries)
    node_of = [min(_slot_of(impl, run_id, lock) // per, len(probes) - 1) for lock in range(LOCKS)]
    per_node = [0] * len(probes)
    for _, _, lock in holds:
        per_node[node_of[lock]] += 1
    result: dict[str, Any] = {
        "acquisitions": len(holds),
        "acquisitions_per_s": len(holds) / duration_s,
        "served": sum(reply["served"] for reply in replies) / (len(replies) * tasks),
        "overlaps": _overlaps(holds),
        "server_cpu_us_per_acquisition": sum(cpu for _, cpu, _ in deltas) / acquisitions * 1e6,
        "commands_per_acquisition": sum(commands for commands, _, _ in deltas) / acquisitions,
    }
    for i, ((commands, cpu_s, _), own) in enumerate(zip(deltas, per_node, strict=True)):
        result[f"node{i}_share"] = own / acquisitions
        result[f"node{i}_cpu_us_per_own_acquisition"] = cpu_s / max(1, own) * 1e6
        result[f"node{i}_commands_per_own_acquisition"] = commands / max(1, own)
        result[f"node{i}_cpu_share"] = cpu_s / duration_s
    return result


def run(
    binary: str,
    impls: list[str] | None = None,
    *,
    repeats: int,
    quick: bool,
    duration_s: float = 3.0,
    rate: float | None = None,
) -> dict[str, Any]:
    """Every implementation of :data:`IMPLS` (or ``impls``, which may name :data:`FLOORS`) on a
    cluster of its own: first free-running, then paced, each at ``rate`` acquisitions/s in all
    (by default 3/4 of the lowest free-running median of the run), so that the servers' CPU per
    acquisition is compared at one load (see ``paced`` in the module docstring)."""
    names = [name for name in (*IMPLS, *FLOORS) if name in (impls or IMPLS)]
    tasks = TASKS
    if quick:
        duration_s, tasks = 1.0, 16
    free: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    paced: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with EmbeddedCluster(primaries=3, binary=binary) as cluster:
        probes = [ServerProbe(node.url) for node in cluster.primaries]
        try:
            with WorkerPool(PROCESSES) as pool:
                pool.wait_ready()

                def stage(runs: dict[str, list[dict[str, Any]]], pace: float | None) -> None:
                    for repeat in range(repeats):
                        for name in rotated(names, repeat):
                            runs[name].append(
                                _one_run(
                                    pool,
                                    cluster,
                                    probes,
                                    impl=name,
                                    duration_s=duration_s,
                                    tasks=tasks,
                                    rate=pace,
                                )
                            )

                stage(free, None)
                if rate is None:
                    rates = [
                        cast(float, median_of_runs(r).get("acquisitions_per_s", 0.0))
                        for r in free.values()
                    ]
                    # An implementation that failed every run has no rate to pace by.
                    rate = round(0.75 * min([r for r in rates if r > 0] or [0.0]), -1) or None
                if not rate:
                    print("[bench] cluster: no paced runs", file=sys.stderr)
                if rate:
                    stage(paced, rate)
        finally:
            for probe in probes:
                probe.close()
    return {
        "binary": binary,
        "locks": LOCKS,
        "processes": PROCESSES,
        "tasks_per_process": tasks,
        "hold_s": HOLD_S,
        "duration_s": duration_s,
        "labels": {name: LABELS[name] for name in names},
        "impls": {n: {"runs": r, "median": median_of_runs(r)} for n, r in free.items()},
        "paced": {
            "rate": rate,
            "impls": {n: {"runs": r, "median": median_of_runs(r)} for n, r in paced.items() if r},
        },
    }
