"""``rtt``: the floor. PING round trips and a raw SET NX PX + DEL pair, over redis.asyncio."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from ..stats import median_of_runs, percentile

__all__ = ["ping_p50_us", "run"]


async def _timed(call: Callable[[], Awaitable[Any]], n: int) -> list[int]:
    for _ in range(min(200, n)):  # warm up: connection, parser, caches
        await call()
    latencies = []
    for _ in range(n):
        started = time.perf_counter_ns()
        await call()
        latencies.append(time.perf_counter_ns() - started)
    return latencies


async def _measure(url: str, n: int) -> dict[str, float]:
    client = aioredis.Redis.from_url(url)
    key = f"bench:rtt:{uuid.uuid4().hex}"

    async def set_del() -> None:
        await client.set(key, "1", nx=True, px=10_000)
        await client.delete(key)

    try:
        ping = await _timed(client.ping, n)
        pair = await _timed(set_del, n)
    finally:
        await client.aclose()
    return {
        "ping_p50_us": percentile(ping, 50) / 1e3,
        "ping_p99_us": percentile(ping, 99) / 1e3,
        "set_del_p50_us": percentile(pair, 50) / 1e3,
        "set_del_p99_us": percentile(pair, 99) / 1e3,
    }


async def ping_p50_us(url: str, n: int = 2000) -> float:
    """The PING p50 in microseconds right now (the unit of the uncontended ratio)."""
    client = aioredis.Redis.from_url(url)
    try:
        return percentile(await _timed(client.ping, n), 50) / 1e3
    finally:
        await client.aclose()


def run(url: str, *, repeats: int, quick: bool) -> dict[str, Any]:
    n = 1000 if quick else 10_000
    runs = [asyncio.run(_measure(url, n)) for _ in range(repeats)]
    return {"samples": n, "runs": runs, "median": median_of_runs(runs)}
