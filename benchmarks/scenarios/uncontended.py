"""``uncontended``: one task, thousands of acquire + release cycles on a free lock.

Per implementation: cycles/s, cycle latency p50/p99, p50 in units of the PING p50 measured in
the same repeat (the floor is 2.0: one round trip to acquire, one to release), client CPU per
cycle (``time.process_time_ns``) and the server's CPU and commands per cycle (INFO deltas).
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

from ..impls import make
from ..stats import ServerProbe, median_of_runs, percentile
from . import attempt, rotated
from .rtt import ping_p50_us

__all__ = ["run"]


async def _cycles(impl_name: str, url: str, n: int, probe: ServerProbe) -> dict[str, Any]:
    impl = make(impl_name, url, concurrency=1)
    await impl.open()
    try:
        handle = impl.handle(f"bench:uncontended:{uuid.uuid4().hex}")
        for _ in range(min(200, n)):
            await handle.acquire()
            await handle.release()
        latencies = []
        before, cpu_before = probe.sample(), time.process_time_ns()
        started = time.perf_counter_ns()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            await handle.acquire()
            await handle.release()
            latencies.append(time.perf_counter_ns() - t0)
        elapsed_ns = time.perf_counter_ns() - started
        cpu_ns = time.process_time_ns() - cpu_before
        commands, server_cpu_s, _ = before.delta(probe.sample())
    finally:
        await impl.aclose()
    return {
        "cycles_per_s": n / (elapsed_ns / 1e9),
        "p50_us": percentile(latencies, 50) / 1e3,
        "p99_us": percentile(latencies, 99) / 1e3,
        "client_cpu_us_per_cycle": cpu_ns / n / 1e3,
        "server_cpu_us_per_cycle": server_cpu_s / n * 1e6,
        "commands_per_cycle": commands / n,
    }


def run(url: str, impls: list[str], *, repeats: int, quick: bool) -> dict[str, Any]:
    n = 300 if quick else 5000
    probe = ServerProbe(url)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in impls}
    try:
        for repeat in range(repeats):
            ping = asyncio.run(ping_p50_us(url))
            for name in rotated(impls, repeat):
                result = attempt(functools.partial(asyncio.run, _cycles(name, url, n, probe)))
                if "error" not in result:
                    result["ping_p50_us"] = ping
                    result["p50_over_ping"] = result["p50_us"] / ping
                runs[name].append(result)
    finally:
        probe.close()
    return {
        "cycles": n,
        "impls": {name: {"runs": r, "median": median_of_runs(r)} for name, r in runs.items()},
    }
