"""Small measuring helpers: percentiles, medians over repeats, server counters, RSS."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import redis

__all__ = [
    "ServerProbe",
    "ServerSample",
    "median_of_runs",
    "percentile",
    "rss_bytes",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return float(ordered[rank])


def median_of_runs(runs: Iterable[Mapping[str, object]]) -> dict[str, object]:
    """Per numeric field, the median over repeats; other fields are taken from the first run.

    Failed runs (with an ``error`` field) are left out and counted in ``errors``.
    """
    every = list(runs)
    runs = [run for run in every if "error" not in run]
    if not runs:
        return {"errors": len(every), "error": every[0]["error"]} if every else {}
    merged: dict[str, object] = {}
    for key, first in runs[0].items():
        values = [run.get(key) for run in runs]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if isinstance(first, int | float) and not isinstance(first, bool) and numbers:
            merged[key] = statistics.median(numbers)
        elif isinstance(first, bool):
            merged[key] = all(bool(v) for v in values)
        else:
            merged[key] = first
    merged["errors"] = len(every) - len(runs)
    return merged


@dataclass(frozen=True, slots=True)
class ServerSample:
    at_ns: int
    commands: int
    cpu_s: float  # user + system, main process and threads

    def delta(self, later: ServerSample) -> tuple[int, float, float]:
        """(commands, CPU seconds, wall seconds) from this sample to ``later``.

        The INFO call that took ``later`` is counted by the server and subtracted here.
        """
        return (
            later.commands - self.commands - 1,
            later.cpu_s - self.cpu_s,
            (later.at_ns - self.at_ns) / 1e9,
        )


class ServerProbe:
    """Reads the server's counters (``INFO stats cpu``) and client list over its own connection."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, decode_responses=True)

    def sample(self) -> ServerSample:
        info = self._redis.execute_command("INFO", "stats", "cpu")  # type: ignore[no-untyped-call]
        return ServerSample(
            at_ns=time.perf_counter_ns(),
            commands=int(info["total_commands_processed"]),
            cpu_s=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        )

    def command_calls(self) -> dict[str, int]:
        """Calls per command so far (``INFO commandstats``), commands run by scripts included.

        The probe's own ``INFO`` calls are left out (``info`` is dropped): nothing else in a
        benchmark sends INFO.
        """
        info = self._redis.info("commandstats")
        calls = {}
        for field, value in info.items():
            name = field.removeprefix("cmdstat_")
            if name != "info" and isinstance(value, dict):
                calls[name] = int(value.get("calls", 0))
        return calls

    def server_info(self) -> dict[str, str]:
        info = self._redis.info("server")
        name = str(info.get("server_name") or "redis")
        version = str(info.get("valkey_version") or info.get("redis_version"))
        return {"name": name, "version": version}

    def clients(self) -> tuple[int, int]:
        """(connections, pub/sub connections) open now, not counting this probe."""
        entries = self._redis.client_list()
        pubsub = sum(1 for c in entries if int(c.get("sub", 0)) or int(c.get("psub", 0)))
        return len(entries) - 1, pubsub

    def channels(self, pattern: str = "*") -> int:
        return len(self._redis.pubsub_channels(pattern))

    def dbsize(self) -> int:
        return int(self._redis.dbsize())

    def key_ttls(self, pattern: str) -> list[int]:
        """The PTTL in ms (-1: no expiry) of every key matching ``pattern`` (``SCAN MATCH``);
        keys that expire between the scan and their PTTL are left out."""
        keys = list(self._redis.scan_iter(match=pattern, count=1000))
        ttls: list[int] = []
        for start in range(0, len(keys), 1000):
            pipe = self._redis.pipeline(transaction=False)
            for key in keys[start : start + 1000]:
                pipe.pttl(key)
            ttls += [int(ttl) for ttl in pipe.execute() if int(ttl) != -2]
        return ttls

    def close(self) -> None:
        self._redis.close()


def rss_bytes() -> int:
    """This process's resident set size."""
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
