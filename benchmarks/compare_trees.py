"""The uncontended cycle of two (or more) source trees of aiolock, alternated on one server.

    python benchmarks/compare_trees.py ROUNDS TREE:KIND [TREE:KIND ...]

    git worktree add /tmp/before <commit>
    python benchmarks/compare_trees.py 14 /tmp/before:lock .:lock /tmp/before:spin .:spin

Whether a change made the uncontended cycle dearer: runs of ``run.py uncontended`` on this
shared machine move by more than such a change (the PING it divides by moves with them).  Each
round runs every ``TREE:KIND`` in a fresh process (``PYTHONPATH=TREE``; the order reversed
every other round), on one embedded server: 2,000 PINGs (redis-py), then 4,000 acquire +
release cycles of one task on ``client.lock`` (``lock``) or ``client.spin_lock`` (``spin``).
It prints, per tree and kind, the median over the rounds of the cycle's p50 over the PING's
p50 taken in the same process, the p50s, and the client's CPU per cycle.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

_CYCLES = 4000
_PINGS = 2000


async def _measure(url: str, kind: str) -> dict[str, float]:
    """In the tree's process: the PING p50, the cycle p50 and the client CPU per cycle (µs)."""
    import redis.asyncio as aioredis

    import aiolock

    probe = aioredis.Redis.from_url(url)
    for _ in range(200):
        await probe.ping()
    pings = []
    for _ in range(_PINGS):
        started = time.perf_counter_ns()
        await probe.ping()
        pings.append(time.perf_counter_ns() - started)
    await probe.aclose()
    async with aiolock.Client.from_url(url) as client:
        lock = client.lock(f"trees:{kind}") if kind == "lock" else client.spin_lock("trees:spin")
        for _ in range(200):
            await lock.lock()
            await lock.unlock()
        cycles = []
        cpu = time.process_time()
        for _ in range(_CYCLES):
            started = time.perf_counter_ns()
            await lock.lock()
            await lock.unlock()
            cycles.append(time.perf_counter_ns() - started)
        cpu = time.process_time() - cpu
    return {
        "ping": statistics.median(pings) / 1e3,
        "p50": statistics.median(cycles) / 1e3,
        "cpu": cpu / _CYCLES * 1e6,
    }


def _run(url: str, tree: str, kind: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--measure", url, kind],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # not this tree's directory, which would come first on sys.path
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main(rounds: int, targets: list[str]) -> None:
    from aiolock.testing.embedded import EmbeddedServer

    results: dict[str, list[dict[str, float]]] = {target: [] for target in targets}
    with EmbeddedServer() as server:
        for index in range(rounds):
            for target in targets if index % 2 == 0 else targets[::-1]:
                tree, _, kind = target.rpartition(":")
                results[target].append(_run(server.url, tree, kind))
    for target, runs in results.items():
        ratio = statistics.median(run["p50"] / run["ping"] for run in runs)
        p50 = statistics.median(run["p50"] for run in runs)
        ping = statistics.median(run["ping"] for run in runs)
        cpu = statistics.median(run["cpu"] for run in runs)
        print(
            f"{target:32s} p50/PING {ratio:.2f}  p50 {p50:.0f} µs  PING {ping:.0f} µs"
            f"  client CPU {cpu:.0f} µs/cycle"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(asyncio.run(_measure(sys.argv[2], sys.argv[3]))))
    else:
        main(int(sys.argv[1]), sys.argv[2:])
