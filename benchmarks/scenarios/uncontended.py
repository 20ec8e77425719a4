"""``uncontended``: one task, thousands of acquire + release cycles on a free lock.

Per implementation: cycles/s, cycle latency p50/p99, p50 in units of the PING p50 measured
between its cycles (the floor is 2.0: one round trip to acquire, one to release), client CPU
per cycle (``time.process_time_ns``) and the server's CPU and commands per cycle (INFO deltas).

The cycles run in blocks of :data:`_BLOCK`, each followed by :data:`_PINGS` PINGs from a
redis-py client of their own: the ratio's two sides are measured in the same seconds.  On a
shared 2-core machine the PING p50 moves by half from one minute to the next, and a PING
measured once per repeat made the ratio move with it (2.0 to 3.1 x over three runs of the
same tree).  The server's counters are read around the cycle blocks only.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

from ..impls import make
from ..stats import ServerProbe, median_of_runs, percentile
from . import attempt, rotated

__all__ = ["run"]


_BLOCK = 250  # cycles between two runs of PINGs
_PINGS = 100  # PINGs after each block


async def _cycles(impl_name: str, url: str, n: int, probe: ServerProbe) -> dict[str, Any]:
    impl = make(impl_name, url, concurrency=1)
    await impl.open()
    pinger = aioredis.Redis.from_url(url)
    try:
        handle = impl.handle(f"bench:uncontended:{uuid.uuid4().hex}")
        for _ in range(min(200, n)):
            await handle.acquire()
            await handle.release()
            await pinger.ping()
        latencies: list[int] = []
        pings: list[int] = []
        elapsed_ns = cpu_ns = commands = 0
        server_cpu_s = 0.0
        while len(latencies) < n:
            block = min(_BLOCK, n - len(latencies))
            before, cpu_before = probe.sample(), time.process_time_ns()
            started = time.perf_counter_ns()
            for _ in range(block):
                t0 = time.perf_counter_ns()
                await handle.acquire()
                await handle.release()
                latencies.append(time.perf_counter_ns() - t0)
            elapsed_ns += time.perf_counter_ns() - started
            cpu_ns += time.process_time_ns() - cpu_before
            block_commands, block_cpu_s, _ = before.delta(probe.sample())
            commands += block_commands
            server_cpu_s += block_cpu_s
            for _ in range(_PINGS):
                t0 = time.perf_counter_ns()
                await pinger.ping()
                pings.append(time.perf_counter_ns() - t0)
    finally:
        await pinger.aclose()
        await impl.aclose()
    p50_us = percentile(latencies, 50) / 1e3
    ping_us = percentile(pings, 50) / 1e3
    return {
        "cycles_per_s": n / (elapsed_ns / 1e9),
        "p50_us": p50_us,
        "p99_us": percentile(latencies, 99) / 1e3,
        "ping_p50_us": ping_us,
        "p50_over_ping": p50_us / ping_us,
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
            for name in rotated(impls, repeat):
                result = attempt(functools.partial(asyncio.run, _cycles(name, url, n, probe)))
                runs[name].append(result)
    finally:
        probe.close()
    return {
        "cycles": n,
        "impls": {name: {"runs": r, "median": median_of_runs(r)} for name, r in runs.items()},
    }
