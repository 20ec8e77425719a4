"""What one watchdog renewal round costs the client on a 3-primary embedded Cluster.

    python benchmarks/watchdog_round.py [--server valkey|redis] [--holds 1000,10000]
        [--rounds 3]

For each count of holds, one client takes that many ``lease=None`` holds (plain locks whose
names spread over every slot, so over the three nodes; one explicit owner, so that no task's
end drops them), then runs ``--rounds`` renewal rounds one after another
(``Watchdog.renew_once``, the round the watchdog's own loop starts every third of a lease; that
loop sleeps through the measurement, since the lease is long).  It prints the median over the
rounds of the round's process CPU (``time.process_time``: this process only, not the nodes),
its wall time, and the CPU per hold; then the ratio of the CPU of the largest count to the
smallest.  On a Cluster a round renews per slot, so about as many groups as holds: linear work
gives a ratio of about 10 for 1,000 and 10,000 holds; the target is under 12.  Figures, not
assertions: ``tests/integration/topology/test_cluster.py`` holds the check (a round reads the
registry once).

One run on a shared 2-core machine (the defaults; medians of 3 rounds):

    server  holds   round CPU ms  round wall ms  CPU us/hold
    valkey   1,000         146.7          371.4        146.7
    valkey  10,000        1539.9         2370.1        154.0   ratio 10.5
    redis    1,000         134.4          163.0        134.4
    redis   10,000        1249.4         1321.9        124.9   ratio 9.3

Before each group's task was handed its own holds (every one regrouped them all), one round
took 1.50 s of CPU for 1,000 holds and 20.0 s for 3,000 (valkey, one round each): 13x for 3x.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this checkout's aiolock, not an installed one
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from redis.asyncio import RedisCluster

import aiolock
from aiolock.testing.embedded import EmbeddedCluster

_LEASE = 600.0  # the watchdog's own rounds come every 200 s: none during a measurement
_CONCURRENT = 200  # acquires in flight while the holds are taken


async def _round_costs(url: str, holds: int, rounds: int) -> tuple[list[float], list[float]]:
    """Per round: (process CPU seconds, wall seconds) of renewing ``holds`` holds."""
    redis = RedisCluster.from_url(url, max_connections=4 * _CONCURRENT)
    await redis.initialize()
    client = aiolock.Client(
        redis, key_prefix=f"bench-watchdog-{uuid.uuid4().hex[:8]}", watchdog_timeout=_LEASE
    )
    try:
        locks = [client.lock(f"hold-{index}", owner="bench") for index in range(holds)]
        for start in range(0, holds, _CONCURRENT):
            await asyncio.gather(*(lock.lock() for lock in locks[start : start + _CONCURRENT]))
        watchdog = locks[0].services.watchdog
        renewals = watchdog.renewals
        cpu, wall = [], []
        for _ in range(rounds):
            cpu_start, wall_start = time.process_time(), time.perf_counter()
            await watchdog.renew_once()
            cpu.append(time.process_time() - cpu_start)
            wall.append(time.perf_counter() - wall_start)
        if watchdog.renewals - renewals != rounds * holds:
            raise RuntimeError(f"{watchdog.renewals - renewals} renewals, not {rounds * holds}")
        for start in range(0, holds, _CONCURRENT):
            await asyncio.gather(*(lock.unlock() for lock in locks[start : start + _CONCURRENT]))
        return cpu, wall
    finally:
        await client.aclose()
        await redis.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--holds", default="1000,10000", help="comma-separated hold counts")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = sorted(int(count) for count in args.holds.split(","))
    if not counts or counts[0] < 1 or args.rounds < 1:
        parser.error("--holds and --rounds must be positive")
    cpu_of: dict[int, float] = {}
    with EmbeddedCluster(primaries=3, binary=args.server) as cluster:
        print(f"{args.server} cluster, 3 primaries; medians of {args.rounds} round(s)")
        print(f"{'holds':>7}  {'round CPU ms':>12}  {'round wall ms':>13}  {'CPU us/hold':>11}")
        for count in counts:
            cpu, wall = await _round_costs(cluster.url, count, args.rounds)
            cpu_of[count] = statistics.median(cpu)
            print(
                f"{count:>7,}  {cpu_of[count] * 1000:>12.1f}  "
                f"{statistics.median(wall) * 1000:>13.1f}  {cpu_of[count] / count * 1e6:>11.1f}"
            )
    if len(counts) > 1:
        low, high = counts[0], counts[-1]
        print(
            f"CPU ratio {high:,} / {low:,} holds: {cpu_of[high] / cpu_of[low]:.2f} "
            f"(holds x{high / low:g}; target < {1.2 * high / low:g})"
        )


if __name__ == "__main__":
    asyncio.run(main())
