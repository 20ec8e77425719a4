"""Where a hand-off's time goes: the contended scenario's shape, traced step by step.

``python benchmarks/trace_handoff.py [aiolock|aiolock-fair] [processes] [tasks]`` starts an
embedded server, runs P processes x T tasks on one lock (1 ms hold) for 3 s, and prints the
p50 of each step from a holder's release to the next grant:

- ``release -> sent``: the releasing task's client, up to the release's bytes leaving;
- ``sent -> message``: the server runs the release and publishes; the message reaches the
  next holder's process, which wakes and reads it;
- ``message -> granted``: that process, from the message read to the acquire returning (the
  message is the grant, for both locks).

A diagnostic, not a scenario of ``run.py``: it wraps three of aiolock's internal functions
(the socket write, the message delivery, the fair lock's grant by message) to timestamp them,
so it follows their names as they change.  Timestamps are CLOCK_MONOTONIC, one clock for every
process on the machine.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiolock import _scripts
from aiolock._core.line import LineEntry
from aiolock._redis import wire
from aiolock._redis.entry import Entry
from aiolock.fair.entry import NamedEntry
from aiolock.testing.embedded import EmbeddedServer
from benchmarks.scenarios.contended import HOLD_S, contend
from benchmarks.workers import WorkerPool

Log = list[tuple[str, int]]


def _instrument(log: Log) -> None:
    releases = {_scripts.FAIR_RELEASE.sha, _scripts.FAIR_LAST.sha, _scripts.LOCK_RELEASE.sha}
    write = wire.write

    async def traced_write(conn: Any, *commands: tuple[Any, ...]) -> None:
        if commands[0][0] == "EVALSHA" and commands[0][1] in releases:
            log.append(("sent", time.perf_counter_ns()))
        await write(conn, *commands)

    wire.write = traced_write
    for entry in (Entry, NamedEntry, LineEntry):
        deliver = entry.deliver

        def traced_deliver(self: Any, payload: bytes, deliver: Any = deliver) -> None:
            log.append(("message", time.perf_counter_ns()))
            deliver(self, payload)

        entry.deliver = traced_deliver  # type: ignore[method-assign]


async def traced(**kwargs: Any) -> dict[str, Any]:
    """A worker's share: the contended scenario's :func:`~benchmarks.scenarios.contended.
    contend`, with the internal steps timestamped; its ``(granted, released)`` records give
    the grant and release steps."""
    log: Log = []
    _instrument(log)
    result = await contend(**kwargs)
    for granted, released, _ in result["records"]:
        log += [("granted", granted), ("release", released)]
    return {"log": log}


def _steps(logs: list[Log], start: int, end: int) -> dict[str, list[int]]:
    events = sorted(
        (t, kind, worker) for worker, log in enumerate(logs) for kind, t in log if start <= t < end
    )
    steps: dict[str, list[int]] = {
        "release -> sent": [],
        "sent -> message": [],
        "message -> granted": [],
        "release -> granted": [],
    }
    release: tuple[int, int] | None = None
    sent: int | None = None
    message: dict[int, int] = {}
    for t, kind, worker in events:
        if kind == "release":
            release, sent = (t, worker), None
        elif kind == "sent" and release is not None and release[1] == worker and sent is None:
            sent = t
            steps["release -> sent"].append(t - release[0])
        elif kind == "message":
            message[worker] = t
        elif kind == "granted" and release is not None:
            steps["release -> granted"].append(t - release[0])
            read = message.get(worker)
            if sent is not None and read is not None and read > sent:
                steps["sent -> message"].append(read - sent)
                steps["message -> granted"].append(t - read)
    return steps


def main() -> None:
    impl = sys.argv[1] if len(sys.argv) > 1 else "aiolock-fair"
    processes = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    tasks = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    with EmbeddedServer() as server, WorkerPool(processes) as pool:
        pool.wait_ready()
        key = f"bench:trace:{uuid.uuid4().hex}"
        start = time.perf_counter_ns() + 2_000_000_000
        end = start + 3_000_000_000
        job = {"impl": impl, "url": server.url, "key": key, "tasks": tasks, "hold_s": HOLD_S}
        window = {"start_ns": start, "end_ns": end}
        replies = pool.run(
            [(traced, {**job, **window, "first_worker": i * tasks}) for i in range(processes)],
            timeout=30,
        )
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        raise SystemExit(errors[0])
    logs = [reply["log"] for reply in replies]
    steps = _steps(logs, start, end)
    print(f"{impl}, {processes} processes x {tasks} tasks, hold 1 ms: p50 of each step")
    for name, values in steps.items():
        if values:
            print(f"  {name:<20} {statistics.median(values) / 1e3:7.0f} µs  (n={len(values)})")


if __name__ == "__main__":
    main()
