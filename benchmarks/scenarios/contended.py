"""``contended``: P processes x T tasks hammer one lock, each hold lasting ``hold`` seconds.

Every task loops acquire -> hold -> release and logs ``(granted, released)`` with
``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for every process on the machine).  The
parent merges the logs of the window ``[start, end)`` and derives:

- acquisitions/s;
- the handoff gap, release to the next grant, p50/p99 (the release timestamp is taken before the
  release is sent, the grant timestamp after the acquire returned: the gap holds both calls);
- barging: the share of handoffs that went to the task that had just released;
- served: the share of tasks that acquired at least once;
- overlaps: grants that came before an earlier hold's release timestamp (a broken lock);
- the server's commands per acquisition (``INFO commandstats`` deltas over the window, the
  commands scripts run included; also split into script calls, PUBLISH and the busiest
  commands) and its CPU per acquisition (``INFO cpu``);
- the worker processes' CPU per acquisition (``time.process_time_ns`` over the window) and the
  cores they used (their CPU seconds per second).

At the end of the window tasks that wait are cancelled; holders finish their hold.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..impls import make
from ..stats import ServerProbe, median_of_runs, percentile
from ..workers import WorkerPool
from . import rotated

__all__ = ["Analyser", "analyse", "contend", "one_run", "run"]

# (merged (granted, released, worker) logs, window start, window end, workers) -> figures
Analyser = Callable[[list[tuple[int, int, int]], int, int, int], dict[str, Any]]

HOLD_S = 0.001
_SETUP_S = 1.0  # from sending the jobs to the start of the window


async def contend(
    *,
    impl: str,
    url: str,
    key: str,
    tasks: int,
    hold_s: float,
    start_ns: int,
    end_ns: int,
    first_worker: int,
) -> dict[str, Any]:
    """One process's share: ``tasks`` tasks on ``key`` from ``start_ns`` to ``end_ns``."""
    lock_impl = make(impl, url, concurrency=tasks)
    await lock_impl.open()
    records: list[tuple[int, int, int]] = []
    holding: set[int] = set()

    async def cycle(handle: Any) -> None:
        await handle.acquire()
        await handle.release()

    async def worker(index: int) -> None:
        handle = lock_impl.handle(key)
        while time.perf_counter_ns() < end_ns:
            await handle.acquire()
            granted = time.perf_counter_ns()
            holding.add(index)
            await asyncio.sleep(hold_s)
            released = time.perf_counter_ns()
            await handle.release()
            holding.discard(index)
            records.append((granted, released, first_worker + index))

    try:
        # Warm up: every task opens its connection on a private key before the window.
        await asyncio.gather(*(cycle(lock_impl.handle(f"{key}:warm:{i}")) for i in range(tasks)))
        late_ns = max(0, time.perf_counter_ns() - start_ns)
        await asyncio.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
        cpu_ns = time.process_time_ns()
        running = [asyncio.create_task(worker(index)) for index in range(tasks)]
        await asyncio.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
        cpu_ns = time.process_time_ns() - cpu_ns
        for index, task in enumerate(running):
            if index not in holding:
                task.cancel()
        _, pending = await asyncio.wait(running, timeout=5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        await asyncio.wait_for(lock_impl.aclose(), timeout=5)
    return {"records": records, "late_ns": late_ns, "cpu_ns": cpu_ns}


def analyse(
    records: list[tuple[int, int, int]], start_ns: int, end_ns: int, workers: int
) -> dict[str, Any]:
    """The window's figures from the merged ``(granted, released, worker)`` logs."""
    holds = sorted(r for r in records if start_ns <= r[0] < end_ns)
    gaps: list[int] = []
    barged = overlaps = 0
    latest_release = None
    for previous, current in itertools.pairwise(holds):
        gaps.append(current[0] - previous[1])
        barged += current[2] == previous[2]
        latest_release = max(latest_release or previous[1], previous[1])
        overlaps += current[0] < latest_release
    duration_s = (end_ns - start_ns) / 1e9
    return {
        "acquisitions": len(holds),
        "acquisitions_per_s": len(holds) / duration_s,
        "gap_p50_us": percentile(gaps, 50) / 1e3,
        "gap_p99_us": percentile(gaps, 99) / 1e3,
        "barging": barged / len(gaps) if gaps else float("nan"),
        "served": len({r[2] for r in holds}) / workers,
        "overlaps": overlaps,
    }


def _per_acquisition(
    before: dict[str, int], after: dict[str, int], acquisitions: int
) -> dict[str, Any]:
    """Command counts (``INFO commandstats`` deltas) per acquisition: the total, the script
    calls (round trips that ran a script), PUBLISH, and the busiest commands by name."""
    delta = {name: after[name] - before.get(name, 0) for name in after}
    delta = {name: calls for name, calls in delta.items() if calls > 0}
    scripts = sum(delta.get(name, 0) for name in ("evalsha", "eval", "evalsha_ro", "fcall"))
    busiest = sorted(delta.items(), key=lambda item: -item[1])[:12]
    return {
        "commands_per_acquisition": sum(delta.values()) / acquisitions,
        "script_calls_per_acquisition": scripts / acquisitions,
        "publish_per_acquisition": delta.get("publish", 0) / acquisitions,
        "commands_by_name_per_acquisition": {
            name: round(calls / acquisitions, 2) for name, calls in busiest
        },
    }


def one_run(
    pool: WorkerPool,
    probe: ServerProbe,
    *,
    impl: str,
    url: str,
    tasks: int,
    duration_s: float,
    processes: int | None = None,
    setup_s: float = _SETUP_S,
    analyser: Analyser | None = None,
) -> dict[str, Any]:
    """One window: ``processes`` workers of ``pool`` (all of them by default) x ``tasks``;
    ``analyser`` (:func:`analyse` by default) turns the merged logs into figures."""
    processes = len(pool) if processes is None else processes
    key = f"bench:contended:{uuid.uuid4().hex}"
    start_ns = time.perf_counter_ns() + int(setup_s * 1e9)
    end_ns = start_ns + int(duration_s * 1e9)
    jobs = [
        (
            contend,
            {
                "impl": impl,
                "url": url,
                "key": key,
                "tasks": tasks,
                "hold_s": HOLD_S,
                "start_ns": start_ns,
                "end_ns": end_ns,
                "first_worker": index * tasks,
            },
        )
        for index in range(processes)
    ]
    pool.send(jobs)
    time.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
    before, calls_before = probe.sample(), probe.command_calls()
    time.sleep(max(0.0, (end_ns - time.perf_counter_ns()) / 1e9))
    calls_after = probe.command_calls()
    _, server_cpu_s, _ = before.delta(probe.sample())
    replies = pool.gather(timeout=setup_s + duration_s + 30)
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        return {"error": errors[0]}
    records = [tuple(r) for reply in replies for r in reply["records"]]
    result = (analyser or analyse)(records, start_ns, end_ns, processes * tasks)
    # How long after the window opened the slowest process had warmed up (should be 0).
    result["late_start_ms"] = max(reply["late_ns"] for reply in replies) / 1e6
    if result["late_start_ms"] > 0:
        print(
            f"[bench] {impl} x {processes} processes: the slowest process warmed up "
            f"{result['late_start_ms']:.0f} ms into the window",
            file=sys.stderr,
        )
    acquisitions = max(1, result["acquisitions"])
    result.update(_per_acquisition(calls_before, calls_after, acquisitions))
    result["server_cpu_us_per_acquisition"] = server_cpu_s / acquisitions * 1e6
    # The worker processes' CPU over the window (threads included: python-redis-lock's too).
    client_cpu_ns = sum(reply["cpu_ns"] for reply in replies)
    result["client_cpu_us_per_acquisition"] = client_cpu_ns / acquisitions / 1e3
    result["client_cpus"] = client_cpu_ns / 1e9 / duration_s
    result["commands_per_s"] = result["commands_per_acquisition"] * acquisitions / duration_s
    return result


def run(
    url: str,
    impls: list[str],
    *,
    repeats: int,
    quick: bool,
    processes: int = 4,
    waiters: tuple[int, ...] = (16, 64, 256),
    duration_s: float = 3.0,
) -> dict[str, Any]:
    if quick:
        processes, waiters, duration_s = 2, (8,), 0.5
    probe = ServerProbe(url)
    levels: dict[str, Any] = {}
    try:
        with WorkerPool(processes) as pool:
            pool.wait_ready()
            for total in waiters:
                tasks = max(1, total // processes)
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in impls}
                for repeat in range(repeats):
                    for name in rotated(impls, repeat):
                        runs[name].append(
                            one_run(
                                pool, probe, impl=name, url=url, tasks=tasks, duration_s=duration_s
                            )
                        )
                levels[str(processes * tasks)] = {
                    "processes": processes,
                    "tasks_per_process": tasks,
                    "impls": {n: {"runs": r, "median": median_of_runs(r)} for n, r in runs.items()},
                }
    finally:
        probe.close()
    return {"hold_s": HOLD_S, "duration_s": duration_s, "levels": levels}
