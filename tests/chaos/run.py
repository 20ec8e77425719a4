"""The chaos run: real servers, worker processes, a seeded fault schedule, then the checker.

::

    python -m tests.chaos.run                 # CI mode: 4 workers x 25 tasks, under a minute
    python -m tests.chaos.run --profile minute  # 5 x 30 for a minute, a 2 s watchdog lease
    python -m tests.chaos.run --profile medium  # 4 x 30 for about three minutes
    python -m tests.chaos.run --long          # 8 x 50 for about ten minutes (8+ cores)
    python -m tests.chaos.run --profile long-2core  # 4 x 40 for ten minutes, on 2 cores
    python -m tests.chaos.run --seed 1234     # replay a schedule printed by an earlier run
    python -m tests.chaos.run --cluster       # on a Cluster: 3 workers x 20 tasks, ~40 s
    python -m tests.chaos.run --cluster --profile medium  # 4 x 30 on a Cluster, ~3 minutes

Two phases, each on a server of its own started here (never the shared test server):
*durable* (``appendonly yes``, ``appendfsync always``: restarts keep every lock) checks mutual
exclusion and fencing through every kind of fault; *volatile* (no persistence: restarts lose
every lock) checks that holds which lived through such a restart are reported lost.  Each
worker reaches the server through a :class:`~tests.chaos.proxy.FreezableProxy` of its own.
The exit status is 1 when the checker found a violation; a wait that overran only while its
worker's event loop was blocked ("wait-loop": the machine's share) is shown, not counted.

``--cluster`` runs one phase instead, on a Cluster of 3 primaries with a replica each
(:class:`~aiolock.testing.embedded.EmbeddedCluster`, a 1.5 s node timeout).  The workers connect to
the nodes directly (``cluster=True``, each from another primary's address; no proxies) with
``sync_replicas=1``, so that a failover keeps every hold it did not report lost.  The faults
move the slots of the run's lock names to other primaries while they are held and waited for,
stall a primary (``CLIENT PAUSE``), drop connections on the primaries, and kill one primary
mid-run: its replica takes over, and the killed node then rejoins as the new primary's
replica (until it does, that primary confirms no grant: every grant there waits
``sync_timeout`` and fails with ``LockSyncError``).  The checker is the same: exclusion of the
holds not reported lost, fencing order, nothing stuck, nothing left on any primary.

While the load runs, the orchestrator also samples the lock keys on the server (every
primary) every 150 ms (:class:`~tests.chaos.sampler.KeySampler`): a key seen while no attempt
of its lock was under way, 250 ms after the last ended, and no fault ran (nor in the second
before), is a "lingering-key", a grant nobody knows that blocks the name until its lease runs
out.  The workers record their collector pauses beside their loop lag, so that a late loss while the
collector stopped the holder's loop is "late-loop" (the machine's share), not "late-loss".
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from redis.asyncio import Redis

from aiolock.testing.embedded import EmbeddedCluster, EmbeddedServer

from .checker import Violation, check_phase, format_summary, summarize
from .faults import (
    CLUSTER_KINDS,
    DURABLE_KINDS,
    VOLATILE_KINDS,
    ClusterInjector,
    Fault,
    Injector,
    make_cluster_schedule,
    make_schedule,
)
from .history import Phase, read_attempts, read_gc, read_lag, write_faults
from .proxy import FreezableProxy
from .sampler import KeySampler
from .worker import WorkerConfig, redlock_prefixes

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "chaos"
# Lock names that are easy to get wrong: braces (hash tags), escapes, non-ASCII, a separator.
NAMES = ("orders:42", "{braced}", "%7Bbraced%7D", "ключ-ü", "a}b{c")
# The Cluster run's node timeout (ms): how soon a killed primary's replica takes over.
CLUSTER_NODE_TIMEOUT = 1500


@dataclass(frozen=True)
class Profile:
    workers: int
    tasks: int
    durable: float  # seconds of load in the durable phase
    volatile: float
    watchdog_timeout: float = 1.5
    twitchy_timeout: float = 0.25
    cancel_rate: float = 0.05
    drain: float = 15.0


CI = Profile(workers=4, tasks=25, durable=14.0, volatile=7.0)
# The violation kinds that are the machine's share (see main).
MACHINE = ("wait-loop", "loss-loop", "late-loop")

LONG = Profile(workers=8, tasks=50, durable=480.0, volatile=120.0)
# The long run for a 2-core machine.  With 8 x 50 the run's own processes use about 1.1 cores
# on average (workers 0.7, the proxies, all in this process's one event loop, 0.35, the server
# 0.1), and a fault that drops every connection (kill-normal all, restart, 850 connections)
# makes all of them reconnect and retry at once: the workers' loops then stall for 0.5-2.5 s,
# which breaks bounded waits by as much (wait-loop) and delays the fault schedule itself.  At
# 4 x 40 the same faults and durations load the machine about 40% as much, and a burst fits.
LONG_2CORE = Profile(workers=4, tasks=40, durable=480.0, volatile=120.0)
# Between the two: a few minutes, every fault kind several times over.
MEDIUM = Profile(workers=4, tasks=30, durable=120.0, volatile=40.0)
# One minute at the load that showed spurious losses (issue 28): 5 x 30, a 2 s watchdog lease.
MINUTE = Profile(workers=5, tasks=30, durable=48.0, volatile=12.0, watchdog_timeout=2.0)
PROFILES = {
    "ci": CI,
    "minute": MINUTE,
    "medium": MEDIUM,
    "long": LONG,
    "long-2core": LONG_2CORE,
}
# The CI run on a Cluster (--cluster --profile ci): six server processes share the machine with
# the workers, so fewer of them, and one phase of 12 s with the primary killed halfway.
CLUSTER_CI = Profile(workers=3, tasks=20, durable=12.0, volatile=0.0)


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    kinds: tuple[str, ...]
    config: dict[str, str]
    seconds: float


class WorkerProcess:
    """One ``tests.chaos.worker`` subprocess and its line protocol."""

    def __init__(
        self, process: asyncio.subprocess.Process, config: WorkerConfig, stderr: Path
    ) -> None:
        self.process = process
        self.config = config
        self.stderr = stderr

    @classmethod
    async def spawn(cls, config: WorkerConfig, stderr: Path) -> WorkerProcess:
        with stderr.open("wb") as errors:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.chaos.worker",
                json.dumps(asdict(config)),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=errors,
            )
        return cls(process, config, stderr)

    async def expect(self, word: str, timeout: float) -> Any:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        head, _, payload = line.decode().strip().partition(" ")
        if head != word:
            raise RuntimeError(f"worker {self.config.proc} said {line!r}, expected {word}")
        return json.loads(payload) if payload else None

    def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word.encode() + b"\n")

    async def finish(self) -> None:
        if self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def run_phase(
    spec: PhaseSpec, profile: Profile, seed: int, binary: str, workdir: Path
) -> Phase:
    schedule = make_schedule(
        seed,
        spec.kinds,
        span=spec.seconds,
        lease=profile.watchdog_timeout,
        workers=profile.workers,
    )
    _print_schedule(spec, schedule)
    server = EmbeddedServer(binary=binary, config=spec.config)
    await asyncio.to_thread(server.start)
    proxies = [FreezableProxy(server.port) for _ in range(profile.workers)]
    try:
        urls = [f"redis://127.0.0.1:{await proxy.start()}/0" for proxy in proxies]
        return await _drive(
            spec,
            profile,
            seed=seed,
            workdir=workdir,
            schedule=schedule,
            urls=urls,
            injector=Injector(server, proxies, seed=seed),
            server=server,
            sampled=[server],
            left=lambda clients: leftovers([server], clients),
        )
    finally:
        for proxy in proxies:
            await proxy.aclose()
        await asyncio.to_thread(server.stop)


async def run_cluster_phase(
    spec: PhaseSpec, profile: Profile, seed: int, binary: str, workdir: Path
) -> Phase:
    """The phase on a Cluster of 3 primaries with a replica each; the workers' clients have
    ``sync_replicas=1``, so that the failover keeps every hold (see the module docstring)."""
    schedule = make_cluster_schedule(
        seed,
        spec.kinds,
        span=spec.seconds,
        lease=profile.watchdog_timeout,
        workers=profile.workers,
    )
    _print_schedule(spec, schedule)
    cluster = EmbeddedCluster(replicas=1, binary=binary, node_timeout=CLUSTER_NODE_TIMEOUT)
    await asyncio.to_thread(cluster.start)
    try:
        return await _drive(
            spec,
            profile,
            seed=seed,
            workdir=workdir,
            schedule=schedule,
            # Each worker starts from another node: its clients name the Cluster by another
            # address (which must not change the order MultiLocks take their parts in).
            urls=[
                cluster.primaries[i % len(cluster.primaries)].url for i in range(profile.workers)
            ],
            injector=ClusterInjector(cluster, NAMES, PREFIX, seed=seed),
            server=cluster.primaries[0],
            sampled=cluster.nodes,
            left=lambda clients: leftovers(cluster.primaries, clients),
            cluster=True,
        )
    finally:
        await asyncio.to_thread(cluster.stop)


async def _drive(
    spec: PhaseSpec,
    profile: Profile,
    *,
    seed: int,
    workdir: Path,
    schedule: Sequence[Fault],
    urls: list[str],
    injector: Injector | ClusterInjector,
    server: EmbeddedServer,
    sampled: Sequence[EmbeddedServer],
    left: Callable[[dict[str, str]], Awaitable[list[str]]],
    cluster: bool = False,
) -> Phase:
    """Start a worker on each URL, apply the schedule, drain, stop, and collect the phase;
    the lock keys of ``sampled`` are sampled from the start of the load to the drain's end."""
    phase = Phase(spec.name)
    workers: list[WorkerProcess] = []
    watching: asyncio.Task[None] | None = None
    try:
        for index, url in enumerate(urls):
            config = WorkerConfig(
                proc=index,
                url=url,
                seed=seed,
                tasks=profile.tasks,
                names=list(NAMES),
                key_prefix=PREFIX,
                out=str(workdir / f"{spec.name}-{index}.jsonl"),
                watchdog_timeout=profile.watchdog_timeout,
                twitchy_timeout=profile.twitchy_timeout,
                cancel_rate=profile.cancel_rate,
                drain=profile.drain,
                cluster=cluster,
                sync_replicas=1 if cluster else 0,
            )
            workers.append(
                await WorkerProcess.spawn(config, workdir / f"{spec.name}-{index}.stderr")
            )
        await asyncio.gather(*(worker.expect("READY", 60) for worker in workers))
        machine = Machine([w.process.pid for w in workers], server)
        sampling = asyncio.create_task(machine.sample())
        keys = KeySampler(sampled, PREFIX)
        watching = asyncio.create_task(keys.run())
        start = time.monotonic_ns()
        try:
            await asyncio.gather(injector.run(schedule, start), asyncio.sleep(spec.seconds))
        finally:
            sampling.cancel()
            await asyncio.wait([sampling])
        print(f"   machine: {machine.report()}")
        await injector.heal()
        phase.faults, phase.amnesia = injector.events, injector.amnesia
        write_faults(workdir / f"{spec.name}-faults.json", start, phase.faults)
        for event in phase.faults:
            if event.kind in ("cut-request", "failover", "migrate"):
                print(f"   {event.kind} at +{(event.t_start - start) / 1e9:.2f}s: {event.detail}")
        for worker in workers:
            worker.send("stop")
        drain = profile.drain + 15
        try:
            drained = await asyncio.gather(*(worker.expect("DRAINED", drain) for worker in workers))
        finally:
            watching.cancel()
            await asyncio.wait([watching])
        phase.keys = keys.samples
        print(f"   lock keys: {len(keys.samples)} sightings, {keys.failed} scans failed")
        clients = {
            client_id: f"worker {worker.config.proc} {kind}"
            for worker, report in zip(workers, drained, strict=True)
            for kind, client_id in report["clients"].items()
        }
        phase.problems += await left(clients)
        for worker in workers:
            worker.send("close")
        for worker in workers:
            done = await worker.expect("DONE", 30)
            phase.problems += [f"worker {worker.config.proc}: {p}" for p in done["problems"]]
            _print_logs(worker.config.proc, done["logs"])
            _print_lag(worker.config.proc, done["lag"])
            if any(problem.startswith("stranded") for problem in done["problems"]):
                _print_stranded(worker.config.proc, worker.stderr)
            await worker.finish()
            phase.attempts += read_attempts(Path(worker.config.out))
            phase.lag[worker.config.proc] = read_lag(Path(worker.config.out + ".lag"))
            phase.gc[worker.config.proc] = read_gc(Path(worker.config.out + ".gc"))
    finally:
        if watching is not None:
            watching.cancel()
            await asyncio.wait([watching])
        for worker in workers:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()
    return phase


async def leftovers(
    servers: Sequence[EmbeddedServer], clients: dict[str, str], grace: float = 1.0
) -> list[str]:
    """What :func:`leftovers_on` finds on each of ``servers`` (a Cluster's primaries)."""
    found = []
    for server in servers:
        found += await leftovers_on(server, clients, grace)
    return found


async def leftovers_on(
    server: EmbeddedServer, clients: dict[str, str], grace: float = 1.0
) -> list[str]:
    """Keys and subscriptions that remain once every worker has drained, after ``grace``
    seconds for in-flight expiries.  Only markers written after a fault, for a resend window,
    may stay: a meta hash of per-request marks alone (``<owner>/<n>`` -> the server time until
    which it is kept, at most ``MARKER_WINDOW_MS`` from now, the hash living no longer than its
    last mark), a semaphore's set of the same marks (``<prefix>:semaphore:{name}:marks``), a
    sorted set holding no live lease (void marks of earlier versions, with negative scores,
    kept it alive; the next call drops them and the leases that ended); and the fencing
    counters (one per key prefix: the RedLocks' servers have their own; on a Cluster one per
    slot and prefix); a fair waiters' client's alive key that expires within its timeout.
    Anything else is left behind: a lock hash of any kind, a meta hash with
    any other field (a marker of a fault-free call) or kept past its marks, a fair lock's queue
    (``<prefix>:fair:{name}:ql``, a list of its waiters: every waiter that gave up must have
    left it), a subscription (a release channel, or a fair lock's wake-up channel).

    ``clients`` names the workers' clients by id, to say whose owners a leftover names."""

    def whose(owner: object) -> str:
        client_id, _, rest = _text(owner).partition(":")
        return f"{clients.get(client_id, client_id)} {rest}"

    prefixes = redlock_prefixes(PREFIX)
    counters = {f"{prefix}:fence".encode() for prefix in prefixes}
    slot_counters = tuple(f"{prefix}:fence{{".encode() for prefix in prefixes)
    async with Redis(host=server.host, port=server.port) as redis:
        deadline = time.monotonic() + grace
        while True:
            keys = sorted(
                [
                    key
                    async for key in redis.scan_iter(match=f"{PREFIX}*")  # and the RedLocks'
                    if key not in counters and not key.startswith(slot_counters)
                ]
            )
            channels = await redis.pubsub_channels(f"{PREFIX}*")
            channels += await redis.execute_command(  # type: ignore[no-untyped-call]
                "PUBSUB", "SHARDCHANNELS", f"{PREFIX}*"
            )
            if (not keys and not channels) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        found = []
        for key in keys:
            pttl = await redis.pttl(key)
            if pttl == -2:
                continue  # it expired between the scan and now: not left behind
            if key.endswith(b":meta"):
                seconds, micros = await redis.time()
                now = seconds * 1000 + micros // 1000
                meta = await redis.hgetall(key)
                bad = meta and _bad_marks(meta, now, pttl)  # none: it expired meanwhile
                if bad:
                    found.append(f"meta hash left behind: {key!r} (pttl {pttl} ms, {bad})")
                continue
            if key.startswith(f"{PREFIX}:semaphore:".encode()) and key.endswith(b":marks"):
                # A semaphore's void marks: request -> until when (server ms), like a meta hash.
                seconds, micros = await redis.time()
                now = seconds * 1000 + micros // 1000
                marks = dict(
                    cast(list[tuple[bytes, float]], await redis.zrange(key, 0, -1, withscores=True))
                )
                bad = _bad_marks({m: int(s) for m, s in marks.items()}, now, pttl)
                if bad:
                    found.append(f"semaphore marks left behind: {key!r} (pttl {pttl} ms, {bad})")
                continue
            if key.startswith(f"{PREFIX}:fair:alive".encode()):
                # A client's alive key (scripts/fair/_queue.lua): deleted when its last fair
                # waiter leaves; a deletion lost to a fault leaves it to expire, within one
                # fair_wait_timeout (the workers' default).
                if pttl > FAIR_WAIT_TIMEOUT_MS:
                    found.append(f"alive key kept past its timeout: {key!r} (pttl {pttl} ms)")
                continue
            if key.startswith(f"{PREFIX}:fair:".encode()) and key.endswith(b":ql"):
                # Members '<lease ms> <request n> <wait ms> <deadline> <owner>'.
                entries = [_text(m).split(" ", 4) for m in await redis.lrange(key, 0, -1)]
                waiters = [(m[-1], " ".join(m[:-1])) for m in entries]
                named = ", ".join(f"{whose(owner)} ({_text(v)})" for owner, v in waiters[:5])
                found.append(
                    f"fair queue left behind: {key!r} (pttl {pttl} ms, {len(waiters)} "
                    f"waiter(s): {named})"
                )
            else:
                fields: dict[Any, Any] = {}
                kind = await redis.type(key)
                if kind == b"hash":
                    fields = await redis.hgetall(key)
                owners = [
                    f"{whose(field)} x{_text(count)}"
                    for field, count in fields.items()
                    if not field.startswith((b":", b"f:", b"r:", b"x:", b"q:"))
                ]
                if kind == b"zset":  # a semaphore's permits (or readers): id -> lease end
                    seconds, micros = await redis.time()
                    now = seconds * 1000 + micros // 1000
                    if not await redis.zcount(key, f"({now}", "+inf"):
                        # Void marks (negative scores) and leases that ended, which the next
                        # call drops: nothing is held, and the key expires with its marks.
                        continue
                    members = cast(
                        list[tuple[bytes, float]],
                        await redis.zrangebyscore(key, "(0", "+inf", 0, 5, withscores=True),
                    )
                    owners = [f"{_text(m)} ({score - now:+.0f} ms)" for m, score in members]
                # The token: a read-write lock's ':fence', a reentrant hold's 'f:<owner>'.
                tokens = [v for f, v in fields.items() if f == b":fence" or f.startswith(b"f:")]
                token = ", ".join(_text(v) for v in tokens) or "?"
                found.append(
                    f"lock key left behind: {key!r} (pttl {pttl} ms, token {token}, held by "
                    f"{', '.join(owners) or 'nobody'})"
                )
        found += [f"subscription left behind: {channel!r}" for channel in channels]
        return found


# The workers' clients' fair_wait_timeout: the default.
FAIR_WAIT_TIMEOUT_MS = 5_000

# The longest resend window of the workers' clients (aiolock._core.services.resend_window): the
# steady one's, 4 attempts x (5 + 5) s of socket timeouts + 3 backoffs of at most 0.2 s.
MARKER_WINDOW_MS = 41_000


def _bad_marks(fields: dict[Any, Any], now: int, pttl: int) -> str:
    """What is wrong with a meta hash left after a run, if anything: a field that is no
    per-request mark, a mark kept for longer than a resend window, or a hash that outlives its
    last mark (empty: nothing)."""
    until = 0
    for field, value in fields.items():
        try:
            ends = int(value)
        except ValueError:
            ends = None
        if b"/" not in field or ends is None:
            return f"field {_text(field)!r} = {_text(value)!r} is no resend mark"
        if ends - now > MARKER_WINDOW_MS:
            return f"mark {_text(field)!r} kept {ends - now} ms more, past a resend window"
        until = max(until, ends)
    if pttl < 0 or pttl > until - now + 1_000:
        return f"kept {pttl} ms, past its last mark ({until - now} ms)"
    return ""


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Machine:
    """How loaded the machine was during a phase: the load average, the CPU time the whole
    machine, the workers, the server and this process (the proxies) used (from ``/proc``)."""

    def __init__(self, workers: list[int], server: EmbeddedServer) -> None:
        self._workers = workers
        self._server = server
        self._loads: list[float] = []
        self._machine: list[tuple[float, float]] = []  # (busy s, total s) per sample
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (first, last) CPU seconds
        self._tick = os.sysconf("SC_CLK_TCK")

    def _process(self, pid: int | None) -> None:
        if pid is None:
            return
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return
        used = (int(stat[11]) + int(stat[12])) / self._tick
        first, _ = self._cpu.get(pid, (used, used))
        self._cpu[pid] = (first, used)

    def _snapshot(self) -> None:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        total = sum(fields[:8])
        self._machine.append(((total - idle) / self._tick, total / self._tick))
        for pid in [*self._workers, os.getpid(), self._server.pid]:
            self._process(pid)

    async def sample(self) -> None:
        try:
            self._snapshot()
            while True:
                await asyncio.sleep(1.0)
                self._loads.append(os.getloadavg()[0])
                self._snapshot()
        except (OSError, ValueError):
            return

    def report(self) -> str:
        if len(self._machine) < 2:
            return "no /proc figures"
        (busy0, total0), (busy1, total1) = self._machine[0], self._machine[-1]
        cores = os.cpu_count() or 1
        wall = (total1 - total0) / cores

        def used(pids: list[int]) -> float:
            return sum(last - first for pid, (first, last) in self._cpu.items() if pid in pids)

        workers, orchestrator = used(self._workers), used([os.getpid()])
        server = sum(last - first for _, (first, last) in self._cpu.items()) - workers
        server -= orchestrator
        return (
            f"{cores} cores, load avg (1 min) max {max(self._loads):.1f}, CPU busy "
            f"{(busy1 - busy0) / (total1 - total0):.0%}; over {wall:.0f}s the workers used "
            f"{workers / wall:.2f} cores, the server {server / wall:.2f}, this process (the "
            f"proxies) {orchestrator / wall:.2f}"
        )


def _print_schedule(spec: PhaseSpec, schedule: Sequence[Fault]) -> None:
    options = " ".join(f"{key}={value}" for key, value in spec.config.items())
    print(f"== phase {spec.name} [{options}]: {spec.seconds:.0f}s, {len(schedule)} faults")
    for fault in schedule:
        print(f"   {fault}")
    sys.stdout.flush()


def _print_logs(proc: int, logs: dict[str, int]) -> None:
    if logs:
        text = ", ".join(f"{key} x{count}" for key, count in sorted(logs.items()))
        print(f"   worker {proc} library log: {text}")


def _print_stranded(proc: int, stderr: Path) -> None:
    """Where a worker's tasks waited when some were stranded: the innermost frames of each
    task stack it dumped that ran library code, alike ones counted once (the temporary
    directory with the whole dump is gone after a CI run).  The stranded operations are among
    them, beside the library's own tasks (subscriber readers, the watchdog) and the
    operations still running normally."""
    stacks: collections.Counter[str] = collections.Counter()
    for block in ("\n" + stderr.read_text(errors="replace")).split("\ntask ")[1:]:
        frames = [line.strip() for line in block.splitlines()[1:] if line.startswith("  ")]
        if any("/aiolock/" in frame for frame in frames):
            stacks[" <- ".join(frame.rsplit("/", 1)[-1] for frame in reversed(frames[-4:]))] += 1
    for stack, count in stacks.most_common(12):
        print(f"   worker {proc} tasks waiting x{count}: {stack}")


def _print_lag(proc: int, lag: dict[str, float]) -> None:
    if lag:
        print(
            f"   worker {proc} loop lag: mean {lag['mean'] * 1000:.1f} ms, p50 "
            f"{lag['p50'] * 1000:.1f} ms, p99 {lag['p99'] * 1000:.0f} ms, max "
            f"{lag['max'] * 1000:.0f} ms, {lag['over_100ms']:.1%} of samples over 100 ms "
            f"(CPU/wall in them {lag['blocked_cpu']:.2f}); GC pauses max "
            f"{lag['gc_max'] * 1000:.0f} ms, total {lag['gc_total']:.2f}s"
        )


def phases(profile: Profile) -> list[PhaseSpec]:
    debug = {"enable-debug-command": "yes"}
    return [
        PhaseSpec(
            "durable",
            DURABLE_KINDS,
            {**debug, "appendonly": "yes", "appendfsync": "always"},
            profile.durable,
        ),
        PhaseSpec("volatile", VOLATILE_KINDS, {**debug, "appendonly": "no"}, profile.volatile),
    ]


def cluster_phases(profile: Profile) -> list[PhaseSpec]:
    """One phase on a Cluster, as long as the durable one (see the module docstring)."""
    return [PhaseSpec("cluster", CLUSTER_KINDS, {}, profile.durable)]


async def run(args: argparse.Namespace) -> int:
    mode = "long" if args.long else args.profile
    profile = CLUSTER_CI if args.cluster and mode == "ci" else PROFILES[mode]
    if mode == "long" and (os.cpu_count() or 1) <= 2:
        print(f"note: {os.cpu_count()} cores: --profile long-2core is calibrated for this machine")
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    print(
        f"aiolock chaos run: mode {mode}{' on a cluster' if args.cluster else ''}, seed {seed}, "
        f"server {args.server}, "
        f"{profile.workers} workers x {profile.tasks} tasks"
    )
    print(
        f"replay: python -m tests.chaos.run --profile {mode} --seed {seed} --server {args.server}"
        + (" --cluster" if args.cluster else "")
    )
    results: list[Phase] = []
    violations: list[Violation] = []
    keep = contextlib.nullcontext(tempfile.mkdtemp(prefix="aiolock-chaos-")) if args.keep else None
    with keep or tempfile.TemporaryDirectory(prefix="aiolock-chaos-") as tmp:
        if args.keep:
            print(f"histories kept in {tmp}")
        specs = cluster_phases(profile) if args.cluster else phases(profile)
        runner = run_cluster_phase if args.cluster else run_phase
        for index, spec in enumerate(specs):
            phase = await runner(spec, profile, seed + index, args.server, Path(tmp))
            results.append(phase)
            found = check_phase(
                phase, wait_slack=args.wait_slack, watchdog_timeout=profile.watchdog_timeout
            )
            violations += found
            print(f"   {spec.name}: {len(phase.attempts)} attempts, {len(found)} violations")
        if args.keep:
            lines = [str(violation) for violation in violations]
            (Path(tmp) / "violations.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("== summary")
    print(format_summary(summarize(results)))
    # A wait that overran only by the time its worker's event loop was blocked (GC, a loaded
    # machine) is the machine's share: no deadline can fire in a blocked loop.  So is a loss
    # with no fault near it whose loop was blocked during the hold.  Shown, but it
    # does not fail the run; every other violation does.
    machine = [violation for violation in violations if violation.kind in MACHINE]
    violations = [violation for violation in violations if violation.kind not in MACHINE]
    if machine:
        print(
            f"machine: {len(machine)} waits overran, or losses came, while their loop was blocked"
        )
        for violation in machine[: args.show]:
            print(f"  {violation}")
    kinds = Counter(violation.kind for violation in violations)
    if not violations:
        print("OK: no violations")
        return 0
    print(f"FAIL: {len(violations)} violations ({', '.join(f'{k} {n}' for k, n in kinds.items())})")
    for violation in violations[: args.show]:
        print(f"  {violation}")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--long", action="store_true", help="--profile long")
    parser.add_argument(
        "--profile",
        choices=tuple(PROFILES),
        default="ci",
        help="ci: 4 workers x 25 tasks, under a minute; medium: 4 x 30, ~3 minutes; long: "
        "8 x 50, ~10 minutes; long-2core: 4 x 40, ~10 minutes, calibrated for 2 cores",
    )
    parser.add_argument("--seed", type=int, help="replay the schedule of this seed")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="one phase on a 3-primary Cluster with replicas: slot moves and a primary killed",
    )
    parser.add_argument("--server", choices=("valkey", "redis"), default="valkey")
    parser.add_argument(
        "--wait-slack", type=float, default=0.5, help="seconds a bounded wait may overrun"
    )
    parser.add_argument("--show", type=int, default=30, help="violations to print")
    parser.add_argument(
        "--keep", action="store_true", help="keep the histories and worker logs (printed path)"
    )
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
