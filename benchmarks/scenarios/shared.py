"""``shared``: locks that several holders share, beside the plain lock in the same run.

Three parts, each the window of :mod:`.contended` (P processes x T tasks, every task looping
acquire -> hold 1 ms -> release, the ``perf_counter_ns`` logs of all processes merged; commands
counted by ``INFO commandstats`` deltas, those scripts run included):

- **reads**: 4 x 16 tasks on ``client.rw_lock(key).read_lock()``, and the same loop on the plain
  ``client.lock(key)``, which serializes them: reads/s, served, server commands and CPU per read.
- **writes**: writers only, 4 x 4 tasks on ``rw_lock(key).write_lock()`` and on the plain lock:
  acquisitions/s, hand-off gap p50/p99, barging, served, commands per acquisition, overlaps.
- **semaphore**: 4 x 16 tasks on ``client.semaphore(key, 5)`` and on a plain redis-py sorted-set
  semaphore written in :mod:`benchmarks.impls` (a Lua ``ZREMRANGEBYSCORE`` + ``ZCARD`` < 5 ->
  ``ZADD``, a 1 ms poll while full, ``ZREM`` to release): acquisitions/s, commands per
  acquisition, and the peak and mean number of holders.

Holders are counted from the merged logs, after the window, so the timed path has only the two
``perf_counter_ns`` calls of every scenario.  A logged hold runs from after the acquire returned
to before the release is sent, inside the hold on the server: the peak is a lower bound of the
server's (it cannot show holders that were not there), and the mean (the logged hold time in
the window / its length) is the average number of holders.
"""

from __future__ import annotations

from typing import Any

from ..impls import PERMITS
from ..stats import ServerProbe, median_of_runs
from ..workers import WorkerPool
from . import rotated
from .contended import HOLD_S, analyse, one_run

__all__ = ["PARTS", "holders", "run"]

PROCESSES = 4
# part -> (tasks per process, the implementations compared, the new kind first)
PARTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "reads": (16, ("aiolock-read", "aiolock")),
    "writes": (4, ("aiolock-write", "aiolock")),
    "semaphore": (16, ("aiolock-semaphore", "zset-semaphore")),
}


def holders(records: list[tuple[int, int, int]], start_ns: int, end_ns: int) -> dict[str, float]:
    """The peak and the mean number of logged holds at once within ``[start_ns, end_ns)``."""
    events: list[tuple[int, int]] = []
    held_ns = 0
    for granted, released, _ in records:
        begin, end = max(granted, start_ns), min(released, end_ns)
        if begin >= end:
            continue
        held_ns += end - begin
        events += [(begin, 1), (end, -1)]
    # At equal times a release goes first: two holds that only touch are not counted together.
    events.sort()
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return {"peak_holders": peak, "mean_holders": held_ns / (end_ns - start_ns)}


def _analyse(
    records: list[tuple[int, int, int]], start_ns: int, end_ns: int, workers: int
) -> dict[str, Any]:
    return {**analyse(records, start_ns, end_ns, workers), **holders(records, start_ns, end_ns)}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians, and the peak of the peaks: a limit must hold in every repeat."""
    median = median_of_runs(runs)
    peaks = [r["peak_holders"] for r in runs if "peak_holders" in r]
    if peaks:
        median["peak_holders_max"] = max(peaks)
    return median


def run(
    url: str,
    impls: list[str],
    *,
    repeats: int,
    quick: bool,
    processes: int = PROCESSES,
    duration_s: float = 3.0,
) -> dict[str, Any]:
    """Every part for the kinds in ``impls`` (the plain lock is ``aiolock``)."""
    if quick:
        duration_s = 2.0
    probe = ServerProbe(url)
    parts: dict[str, Any] = {}
    try:
        with WorkerPool(processes) as pool:
            pool.wait_ready()
            for part, (tasks, kinds) in PARTS.items():
                names = [name for name in kinds if name in impls]
                if not names:
                    continue
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
                for repeat in range(repeats):
                    for name in rotated(names, repeat):
                        runs[name].append(
                            one_run(
                                pool,
                                probe,
                                impl=name,
                                url=url,
                                tasks=tasks,
                                duration_s=duration_s,
                                setup_s=1.2,
                                analyser=_analyse,
                            )
                        )
                parts[part] = {
                    "processes": processes,
                    "tasks_per_process": tasks,
                    "impls": {n: {"runs": r, "median": _median(r)} for n, r in runs.items()},
                }
    finally:
        probe.close()
    return {"hold_s": HOLD_S, "duration_s": duration_s, "permits": PERMITS, "parts": parts}
