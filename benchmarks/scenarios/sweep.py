"""``sweep``: the contended run at a growing number of processes, T tasks each.

The same window as :mod:`.contended` (every task loops acquire -> hold 1 ms -> release, the logs
of all processes merged), at 4, 8 and 16 processes x 8 tasks, for the implementations that
serve every waiter in the contended scenario (the aiolock kinds, redis-py's Lock with a 1 ms
sleep, the SET NX spin lock and python-redis-lock; pottery and redis-py's default 100 ms sleep
leave waiters unserved, see ``contended``).

What grows here is the number of *clients*, not of waiters per client: both aiolock locks wake
one waiter in all on every release (the plain lock names the next client from the lock's waiting
set, the fair lock grants the next in its queue).  A last point, 32 processes x 2 tasks, has the
most clients for the fewest waiters.  Per point:
acquisitions/s, the handoff gap p50/p99, the share of tasks served, and the server's commands
per acquisition (``INFO commandstats``, the commands scripts run included), with the script
calls and PUBLISHes per acquisition beside them.
"""

from __future__ import annotations

from typing import Any

from ..stats import ServerProbe, median_of_runs
from ..workers import WorkerPool
from . import rotated
from .contended import HOLD_S, one_run

__all__ = ["EXTRA", "PROCESSES", "SWEPT", "TASKS", "run"]

PROCESSES = (4, 8, 16)
TASKS = 8
EXTRA = ((32, 2),)  # (processes, tasks each) swept after the others
SWEPT = ("aiolock", "aiolock-fair", "aiolock-spin", "redispy-0.001", "spin", "python-redis-lock")


def run(
    url: str,
    impls: list[str],
    *,
    repeats: int,
    quick: bool,
    processes: tuple[int, ...] = PROCESSES,
    tasks: int = TASKS,
    extra: tuple[tuple[int, int], ...] = EXTRA,
    duration_s: float = 3.0,
) -> dict[str, Any]:
    if quick:
        duration_s = 2.0
    sizes = [(count, tasks) for count in processes] + list(extra)
    names = [name for name in impls if name in SWEPT]
    probe = ServerProbe(url)
    points: dict[str, Any] = {}
    try:
        # One pool for the whole sweep; a point with fewer processes uses the first ones.
        with WorkerPool(max(count for count, _ in sizes)) as pool:
            pool.wait_ready()
            for count, each in sizes:
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
                for repeat in range(repeats):
                    for name in rotated(names, repeat):
                        runs[name].append(
                            one_run(
                                pool,
                                probe,
                                impl=name,
                                url=url,
                                tasks=each,
                                duration_s=duration_s,
                                processes=count,
                                # every process opens its clients and warms up its tasks first
                                setup_s=1.0 + 0.05 * count,
                            )
                        )
                points[str(count) if each == tasks else f"{count}x{each}"] = {
                    "processes": count,
                    "tasks_per_process": each,
                    "impls": {n: {"runs": r, "median": median_of_runs(r)} for n, r in runs.items()},
                }
    finally:
        probe.close()
    return {
        "hold_s": HOLD_S,
        "duration_s": duration_s,
        "tasks_per_process": tasks,
        "points": points,
    }
