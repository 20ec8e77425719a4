"""``fanin``: many tasks of one process wait on a few held locks.

``waiters`` tasks wait on ``locks`` locks (``waiters / locks`` per lock) that one task holds.
First the holders alone, for one window: the commands per second holding costs (renewing the
leases, for a lock with a watchdog).  Once the waiters all wait: the server's connections,
pub/sub connections and channels, the commands per second over a window as long (one watchdog
lease: a lock whose waiters try again when the lease they met runs out does so inside it; the
holders' renewals are in both windows, three rounds each), the commands the server ran in it by
name, and the process's RSS growth per waiter.  Then the holder releases every lock, each
waiter takes its lock once and releases it at once, and the scenario times how long it takes
until every waiter has acquired.

Each run takes a fresh process, so RSS starts from the same place; a run of bare asyncio tasks
waiting on an event gives the floor a waiting task costs without any lock.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from typing import Any

from ..impls import POOL_SIZE, AiolockImpl, make
from ..stats import ServerProbe, median_of_runs, rss_bytes
from ..workers import WorkerPool
from . import rotated

__all__ = ["bare_tasks", "fan_in", "run"]


async def fan_in(
    *,
    impl: str,
    url: str,
    waiters: int,
    locks: int,
    settle_s: float,
    max_settle_s: float,
    window_s: float,
    drain_timeout_s: float,
) -> dict[str, Any]:
    run_id = uuid.uuid4().hex
    keys = [f"bench:fanin:{run_id}:{i}" for i in range(locks)]
    probe = ServerProbe(url)
    connections_before, _ = probe.clients()
    lock_impl = make(impl, url, concurrency=waiters + locks)
    await lock_impl.open()
    acquired: list[int] = []

    failures: list[str] = []

    async def waiter(key: str, log: list[int]) -> None:
        handle = lock_impl.handle(key)
        await handle.acquire()
        log.append(time.perf_counter_ns())
        try:
            await handle.release()
        except Exception as exc:  # a peer's lease ran out under load: count it, go on
            failures.append(f"{type(exc).__name__}: {exc}"[:200])

    if isinstance(lock_impl, AiolockImpl):
        # As a user writes a waiter: the lock object and one call, no handle around them.
        async def waiter(key: str, log: list[int]) -> None:
            lock = lock_impl.lock_object(key)
            await lock.try_lock(wait=None)
            log.append(time.perf_counter_ns())
            try:
                await lock.unlock()
            except Exception as exc:  # a lease ran out under load: count it, go on
                failures.append(f"{type(exc).__name__}: {exc}"[:200])

    try:
        # Fill the connection pool first: its size is the process's, not the waiters'.
        warm = min(POOL_SIZE, waiters)
        await asyncio.gather(*(waiter(f"{keys[0]}:warm:{i}", []) for i in range(warm)))
        holders = [lock_impl.handle(key) for key in keys]
        for holder in holders:
            await holder.acquire()
        alone = probe.sample()
        await asyncio.sleep(window_s)
        holding, _, holding_s = alone.delta(probe.sample())
        gc.collect()
        rss_before = rss_bytes()
        tasks = [asyncio.create_task(waiter(keys[i % locks], acquired)) for i in range(waiters)]
        await _settle(probe, settle_s, max_settle_s)
        rss_after = rss_bytes()
        connections, pubsub = probe.clients()
        channels = probe.channels(f"*{run_id}*")
        calls_before = probe.command_calls()
        before = probe.sample()
        await asyncio.sleep(window_s)
        commands, server_cpu_s, elapsed_s = before.delta(probe.sample())
        calls = probe.command_calls()
        by_name = {name: n - calls_before.get(name, 0) for name, n in calls.items()}

        released = time.perf_counter_ns()
        for holder in holders:
            try:
                await holder.release()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
        _, pending = await asyncio.wait(tasks, timeout=drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await asyncio.wait_for(lock_impl.aclose(), timeout=10)
        probe.close()
    drained = len(acquired) == waiters
    return {
        "connections": connections - connections_before,
        "pubsub_connections": pubsub,
        "channels": channels,
        "commands_per_s_holding": holding / holding_s,
        "commands_per_s_waiting": commands / elapsed_s,
        "commands_waiting": {name: n for name, n in sorted(by_name.items()) if n},
        "server_cpu_share_waiting": server_cpu_s / elapsed_s,
        "rss_kb_per_waiter": (rss_after - rss_before) / waiters / 1024,
        "drain_s": (max(acquired) - released) / 1e9 if drained else float("nan"),
        "acquired_share": len(acquired) / waiters,
        "release_failures": len(failures),
        "first_failure": failures[0] if failures else "",
    }


async def _settle(probe: ServerProbe, minimum_s: float, maximum_s: float) -> None:
    """Wait until the waiters' first attempts are over: the server's command rate is steady.

    Steady means two successive half-second rates within 20 % of each other (or both below
    10/s): a polling lock settles at its polling rate, a parked waiter at none.
    """
    await asyncio.sleep(minimum_s)
    deadline = time.perf_counter() + maximum_s - minimum_s
    previous = None
    sample = probe.sample()
    while time.perf_counter() < deadline:
        await asyncio.sleep(0.5)
        later = probe.sample()
        commands, _, elapsed_s = sample.delta(later)
        rate, sample = commands / elapsed_s, later
        if previous is not None and (
            max(rate, previous) < 10 or abs(rate - previous) <= 0.2 * max(rate, previous)
        ):
            return
        previous = rate


async def bare_tasks(waiters: int, settle_s: float) -> dict[str, Any]:
    """The RSS of ``waiters`` plain tasks parked on an event: the floor for any lock."""
    event = asyncio.Event()
    gc.collect()
    rss_before = rss_bytes()
    tasks = [asyncio.create_task(event.wait()) for _ in range(waiters)]
    await asyncio.sleep(settle_s)
    rss_after = rss_bytes()
    event.set()
    await asyncio.gather(*tasks)
    return {"rss_kb_per_waiter": (rss_after - rss_before) / waiters / 1024}


def run(
    url: str,
    impls: list[str],
    *,
    repeats: int,
    quick: bool,
    waiters: int = 5000,
    locks: int = 100,
) -> dict[str, Any]:
    # Each window: one watchdog lease (30 s), three rounds of the watchdog's renewals.
    settle_s, max_settle_s, window_s, drain_timeout_s = 2.0, 20.0, 30.0, 30.0
    if quick:
        waiters, locks = 500, 10
        settle_s, max_settle_s, window_s, drain_timeout_s = 0.5, 3.0, 1.0, 5.0
    kwargs = {
        "url": url,
        "waiters": waiters,
        "locks": locks,
        "settle_s": settle_s,
        "max_settle_s": max_settle_s,
        "window_s": window_s,
        "drain_timeout_s": drain_timeout_s,
    }
    timeout = max_settle_s + 2 * window_s + drain_timeout_s + 60
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in impls}
    floor: list[dict[str, Any]] = []
    for repeat in range(repeats):
        with WorkerPool(1) as pool:
            floor += pool.run([(bare_tasks, {"waiters": waiters, "settle_s": settle_s})], 60)
        for name in rotated(impls, repeat):
            with WorkerPool(1) as pool:
                runs[name] += pool.run([(fan_in, {"impl": name, **kwargs})], timeout)
    return {
        "waiters": waiters,
        "locks": locks,
        "window_s": window_s,
        "bare_task": median_of_runs(floor),
        "impls": {name: {"runs": r, "median": median_of_runs(r)} for name, r in runs.items()},
    }
