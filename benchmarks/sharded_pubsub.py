"""Classic vs sharded pub/sub on a 3-primary embedded Cluster: what each release costs the nodes.

    python benchmarks/sharded_pubsub.py [--server valkey|redis] [--seconds 3] [--locks 300]
        [--tasks 2] [--repeats 3]

Two clients in one process, ``--locks`` locks spread over the slots, ``--tasks`` tasks per lock
and client, each holding its lock 1 ms, for ``--seconds``; once with the sharded pub/sub the
nodes have (SPUBLISH / SSUBSCRIBE), once forced to classic (PUBLISH, one subscriber to any
node), the order alternating per repeat.  Every release publishes one message.  Per mode it
prints the medians over the repeats of: acquisitions/s; cluster-bus publish messages each node
received per release (``CLUSTER INFO``: a classic PUBLISH is forwarded to every other node, a
sharded one only to the replicas of its shard); server CPU per 1,000 acquisitions per node
(``INFO cpu``).  Figures, not assertions: compare the two modes of one run.

One run on a shared 2-core machine (the defaults; medians of 3):

    server  mode     acq/s  bus msgs received per release, per node  server CPU ms / 1k acq
    valkey  sharded    963  0.00 / 0.00 / 0.00                        58.3 / 55.4 / 54.8
    valkey  classic    647  0.67 / 0.67 / 0.66                        91.6 / 75.2 / 75.9
    redis   sharded   1794  0.00 / 0.00 / 0.00                        40.5 / 41.5 / 40.4
    redis   classic   1231  0.66 / 0.66 / 0.66                        60.8 / 51.4 / 53.4

A classic release crosses the bus to both other primaries (2 messages per release over 3
nodes); a sharded one stays on its node (no replicas here): about 1.5x the acquisitions and
a third less server CPU per acquisition.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this checkout's aiolock, not an installed one
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis import Redis

import aiolock
from aiolock._redis import cluster as _cluster
from aiolock._redis.cluster import ClusterCalls
from aiolock.testing.embedded import EmbeddedCluster

_HOLD = 0.001


async def _classic(node: object) -> bool:
    return False


async def _run_mode(cluster: EmbeddedCluster, *, sharded: bool, args: Any) -> dict[str, Any]:
    real = _cluster._has_sharded_pubsub
    if not sharded:  # what a Cluster of Redis 6 gets; a benchmark knob, not an option
        _cluster._has_sharded_pubsub = _classic
    prefix = f"bench-{'sharded' if sharded else 'classic'}-{time.monotonic_ns()}"
    clients = [
        aiolock.Client.from_url(cluster.url, cluster=True, key_prefix=prefix) for _ in range(2)
    ]
    try:
        for client in clients:  # learn the topology (and the mode) before the window
            await client.lock("warm-up").try_lock(wait=0, lease=1)
            await client.lock("warm-up").force_unlock()
        acquired = 0
        stop = asyncio.Event()

        async def worker(client: aiolock.Client, name: str) -> None:
            nonlocal acquired
            lock = client.lock(name)
            while not stop.is_set():
                async with lock.acquire(lease=10):
                    acquired += 1
                    await asyncio.sleep(_HOLD)

        before = [_node_figures(node.port) for node in cluster.primaries]
        started = time.perf_counter()
        tasks = [
            asyncio.create_task(worker(client, f"order:{i}"))
            for i in range(args.locks)
            for client in clients
            for _ in range(args.tasks)
        ]
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        after = [_node_figures(node.port) for node in cluster.primaries]
        calls = [client._services.calls for client in clients]
        assert all(isinstance(c, ClusterCalls) and c.sharded == sharded for c in calls)
    finally:
        for client in clients:
            await client.aclose()
        _cluster._has_sharded_pubsub = real
    return {
        "rate": acquired / elapsed,
        "bus": [(a[0] - b[0]) / acquired for a, b in zip(after, before, strict=True)],
        "cpu": [1000 * 1000 * (a[1] - b[1]) / acquired for a, b in zip(after, before, strict=True)],
    }


def _node_figures(port: int) -> tuple[int, float]:
    """Cluster-bus publish messages received so far, and server CPU seconds so far."""
    with Redis(port=port, decode_responses=True) as redis:
        info = dict(
            line.split(":", 1)
            for line in redis.execute_command("CLUSTER", "INFO").splitlines()
            if ":" in line
        )
        cpu = redis.info("cpu")
    received = sum(
        int(value)
        for key, value in info.items()
        if key.startswith("cluster_stats_messages_publish") and key.endswith("_received")
    )
    return received, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", default="valkey", choices=["valkey", "redis"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--locks", type=int, default=300)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"sharded": [], "classic": []}
    with EmbeddedCluster(binary=args.server) as cluster:
        for repeat in range(args.repeats):
            for mode in ("sharded", "classic") if repeat % 2 == 0 else ("classic", "sharded"):
                runs[mode].append(await _run_mode(cluster, sharded=mode == "sharded", args=args))
    print(
        f"{args.server}, 3 primaries, {args.locks} locks x 2 clients x {args.tasks} tasks, "
        f"hold 1 ms, {args.seconds:g} s, median of {args.repeats}"
    )
    print(
        f"{'mode':8} {'acq/s':>8}  {'bus msgs received per release, per node':>40}  "
        f"{'server CPU ms per 1k acq, per node':>36}"
    )
    for mode, results in runs.items():
        rate = statistics.median(result["rate"] for result in results)
        bus = [statistics.median(result["bus"][i] for result in results) for i in range(3)]
        cpu = [statistics.median(result["cpu"][i] for result in results) for i in range(3)]
        print(
            f"{mode:8} {rate:8.0f}  {' / '.join(f'{value:.2f}' for value in bus):>40}  "
            f"{' / '.join(f'{value:.1f}' for value in cpu):>36}"
        )


if __name__ == "__main__":
    asyncio.run(main())
