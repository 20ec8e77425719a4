"""``sync``: the blocking face, ``aiolock.sync``, beside the blocking peers, in three figures.

1. **Uncontended cycle p50** (one thread, acquire + release on a free lock) of
   ``aiolock.sync`` against redis-py's blocking ``Lock`` (the target: at most 1.3 x), with
   python-redis-lock and pottery's ``Redlock`` (one master) beside them.
2. **Contended**: 4 processes x 16 threads on one lock, each holding it 1 ms, for a fixed
   window: acquisitions/s and how many of the 64 threads were served at least once (the
   target: every thread, and at least 2 x python-redis-lock's rate).
3. **The blocking call's overhead** over the same async call: half the difference of the
   cycle p50s of ``aiolock.sync`` and ``aiolock.Client`` (two calls per cycle), measured in the
   same repeat (the target: at most 40 us).

Every blocking implementation is written once here, as a factory of per-thread
``(acquire(wait) -> bool, release())`` pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import redis

import aiolock
import aiolock.sync

from ..stats import percentile
from . import attempt, rotated

__all__ = ["IMPLS", "run", "table"]

LEASE_S = 60
HOLD_S = 0.001
PROCESSES, THREADS = 4, 16

Pair = tuple[Callable[[float], bool], Callable[[], None]]


@contextlib.contextmanager
def _aiolock_sync(url: str, kind: str) -> Iterator[Callable[[str], Pair]]:
    with aiolock.sync.Client.from_url(url, key_prefix="bench-sync") as client:

        def pair(key: str) -> Pair:
            lock = getattr(client, kind)(key)
            return (lambda wait: bool(lock.try_lock(wait))), lock.unlock

        yield pair


@contextlib.contextmanager
def _redispy(url: str, sleep: float) -> Iterator[Callable[[str], Pair]]:
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=THREADS + 4, timeout=None)
    client = redis.Redis(connection_pool=pool)
    try:

        def pair(key: str) -> Pair:
            lock = client.lock(key, timeout=LEASE_S, sleep=sleep)
            return (lambda wait: bool(lock.acquire(blocking_timeout=wait))), lock.release

        yield pair
    finally:
        client.close()


@contextlib.contextmanager
def _python_redis_lock(url: str) -> Iterator[Callable[[str], Pair]]:
    import redis_lock  # type: ignore[import-untyped,import-not-found,unused-ignore]

    logging.getLogger("redis_lock").setLevel(logging.ERROR)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=THREADS + 4, timeout=None)
    client = redis.Redis(connection_pool=pool)
    try:

        def pair(key: str) -> Pair:
            lock = redis_lock.Lock(client, key, expire=LEASE_S)
            # Its BLPOP takes whole seconds: a wait below one is rounded up.
            return (lambda wait: bool(lock.acquire(timeout=max(1, round(wait))))), lock.release

        yield pair
    finally:
        client.close()


@contextlib.contextmanager
def _pottery(url: str) -> Iterator[Callable[[str], Pair]]:
    from pottery import Redlock  # type: ignore[import-not-found,unused-ignore]

    logging.getLogger("pottery").setLevel(logging.ERROR)
    client = redis.Redis.from_url(url)
    try:

        def pair(key: str) -> Pair:
            lock = Redlock(key=key, masters={client}, auto_release_time=LEASE_S)
            return (lambda wait: bool(lock.acquire(timeout=wait))), lock.release

        yield pair
    finally:
        client.close()


IMPLS: dict[str, tuple[str, Callable[[str], contextlib.AbstractContextManager[Any]]]] = {
    "aiolock-sync": ("aiolock.sync lock", lambda url: _aiolock_sync(url, "lock")),
    "aiolock-sync-fair": ("aiolock.sync fair_lock", lambda url: _aiolock_sync(url, "fair_lock")),
    "redispy-sync": ("redis-py Lock (blocking) sleep=0.1", lambda url: _redispy(url, 0.1)),
    "redispy-sync-0.001": (
        "redis-py Lock (blocking) sleep=0.001",
        lambda url: _redispy(url, 0.001),
    ),
    "python-redis-lock": ("python-redis-lock", _python_redis_lock),
    "pottery": ("pottery Redlock (1 master)", _pottery),
}
UNCONTENDED = ("aiolock-sync", "redispy-sync", "python-redis-lock", "pottery")


def available() -> list[str]:
    """The implementations whose packages are installed."""
    names = []
    for name in IMPLS:
        module = {"python-redis-lock": "redis_lock", "pottery": "pottery"}.get(name)
        if module is not None:
            try:
                __import__(module)
            except ImportError:
                continue
        names.append(name)
    return names


def _uncontended(name: str, url: str, n: int) -> dict[str, Any]:
    with IMPLS[name][1](url) as pair:
        acquire, release = pair(f"bench:sync:{uuid.uuid4().hex}")
        latencies = []
        for i in range(n + 200):  # the first 200 warm up
            started = time.perf_counter_ns()
            if not acquire(1.0):
                raise RuntimeError("a free lock was refused")
            release()
            if i >= 200:
                latencies.append(time.perf_counter_ns() - started)
    return {"p50_us": percentile(latencies, 50) / 1e3, "p99_us": percentile(latencies, 99) / 1e3}


async def _async_cycle_p50(url: str, n: int) -> float:
    async with aiolock.Client.from_url(url, key_prefix="bench-sync") as client:
        lock = client.lock(f"bench:async:{uuid.uuid4().hex}")
        latencies = []
        for i in range(n + 200):
            started = time.perf_counter_ns()
            await lock.lock()
            await lock.unlock()
            if i >= 200:
                latencies.append(time.perf_counter_ns() - started)
    return percentile(latencies, 50) / 1e3


def _contend(name: str, url: str, key: str, window: float, *, ready: Any, results: Any) -> None:
    """One process: THREADS threads taking ``key`` for HOLD_S each, from the moment every
    process is ready (``ready``, a barrier) until ``window`` seconds later; puts the
    acquisitions of each thread within the window on ``results``."""
    counts = [0] * THREADS
    with IMPLS[name][1](url) as pair:
        pairs = [pair(key) for _ in range(THREADS)]
        ready.wait()  # every process has imported and connected: start together
        end = time.monotonic() + window

        def work(index: int) -> None:
            acquire, release = pairs[index]
            while (left := end - time.monotonic()) > 0:
                if not acquire(left):
                    return
                try:
                    if time.monotonic() <= end:
                        counts[index] += 1
                    time.sleep(HOLD_S)
                finally:
                    release()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    results.put(counts)


def _contended(name: str, url: str, window: float) -> dict[str, Any]:
    key = f"bench:sync:contended:{uuid.uuid4().hex}"
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(
            target=_contend,
            args=(name, url, key, window),
            kwargs={"ready": ready, "results": results},
        )
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = [results.get(timeout=120 + window) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    counts = [count for process in outcomes for count in process]
    return {
        "acquisitions_per_s": sum(counts) / window,
        "threads_served": sum(1 for count in counts if count > 0),
        "threads": len(counts),
        "fewest_per_thread": min(counts),
    }


def run(url: str, *, repeats: int, quick: bool) -> dict[str, Any]:
    names = available()
    n = 300 if quick else 3000
    window = 1.0 if quick else 5.0
    uncontended: dict[str, list[float]] = {name: [] for name in names if name in UNCONTENDED}
    async_p50: list[float] = []
    contended: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for repeat in range(repeats):
        async_p50.append(asyncio.run(_async_cycle_p50(url, n)))
        for name in rotated(list(uncontended), repeat):
            result = attempt(lambda name=name: _uncontended(name, url, n))  # type: ignore[misc]
            if "error" not in result:
                uncontended[name].append(result["p50_us"])
        for name in rotated(names, repeat):
            result = attempt(lambda name=name: _contended(name, url, window))  # type: ignore[misc]
            contended[name].append(result)
    cycle = {name: statistics.median(p50s) for name, p50s in uncontended.items() if p50s}
    async_cycle = statistics.median(async_p50)
    return {
        "cycles": n,
        "window_s": window,
        "labels": {name: IMPLS[name][0] for name in names},
        "uncontended_p50_us": cycle,
        "async_cycle_p50_us": async_cycle,
        "overhead_per_call_us": (cycle["aiolock-sync"] - async_cycle) / 2
        if "aiolock-sync" in cycle
        else None,
        "contended": {name: _median_contended(runs) for name, runs in contended.items()},
    }


def _median_contended(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0] if runs else {}
    return {
        key: statistics.median(r[key] for r in ok)
        for key in ("acquisitions_per_s", "threads_served", "threads", "fewest_per_thread")
    }


def table(section: dict[str, Any]) -> list[str]:
    """The scenario's markdown: the three figures, then the peers side by side."""
    labels = section["labels"]
    cycle = section["uncontended_p50_us"]
    contended = section["contended"]
    out = ["", "### Threads: `aiolock.sync` beside the blocking peers", ""]
    base = cycle.get("redispy-sync")
    if base and "aiolock-sync" in cycle:
        out.append(
            f"- uncontended cycle p50: aiolock.sync {cycle['aiolock-sync']:.0f} us, redis-py "
            f"{base:.0f} us: **{cycle['aiolock-sync'] / base:.2f} x** (target <= 1.3 x)"
        )
    if section.get("overhead_per_call_us") is not None:
        out.append(
            f"- a blocking call's overhead over the same async call (p50, per call): "
            f"**{section['overhead_per_call_us']:.0f} us** (async cycle "
            f"{section['async_cycle_p50_us']:.0f} us; target <= 40 us)"
        )
    ours = contended.get("aiolock-sync", {}).get("acquisitions_per_s")
    theirs = contended.get("python-redis-lock", {}).get("acquisitions_per_s")
    if ours and theirs:
        out.append(
            f"- contended ({PROCESSES} processes x {THREADS} threads, {HOLD_S * 1e3:.0f} ms "
            f"hold): aiolock.sync {ours:.0f}/s, python-redis-lock {theirs:.0f}/s: "
            f"**{ours / theirs:.2f} x** (target >= 2 x, every thread served)"
        )
    out += [
        "",
        "| implementation | uncontended p50 (us) | contended acquisitions/s | threads served "
        "| fewest per thread |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in labels.items():
        c = contended.get(name, {})
        p50 = f"{cycle[name]:.0f}" if name in cycle else ""
        if "error" in c:
            out.append(f"| {label} | {p50} | error: {c['error']} | | |")
            continue
        out.append(
            f"| {label} | {p50} | {c.get('acquisitions_per_s', 0):.0f} | "
            f"{c.get('threads_served', 0):.0f}/{c.get('threads', 0):.0f} | "
            f"{c.get('fewest_per_thread', 0):.0f} |"
        )
    return out
