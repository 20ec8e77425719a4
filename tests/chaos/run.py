"""The chaos run: real servers, worker processes, a seeded fault schedule, then the checker.

::

    python -m tests.chaos.run                 # CI mode: 4 workers x 25 tasks, under a minute
    python -m tests.chaos.run --long          # 8 x 50 for about ten minutes
    python -m tests.chaos.run --seed 1234     # replay a schedule printed by an earlier run

Two phases, each on a server of its own started here (never the shared test server):
*durable* (``appendonly yes``, ``appendfsync always``: restarts keep every lock) checks mutual
exclusion and fencing through every kind of fault; *volatile* (no persistence: restarts lose
every lock) checks that holds which lived through such a restart are reported lost.  Each
worker reaches the server through a :class:`~tests.chaos.proxy.FreezableProxy` of its own.
The exit status is 1 when the checker found a violation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from aiolock.embedded import EmbeddedServer

from .checker import Violation, check_phase, format_summary, summarize
from .faults import DURABLE_KINDS, VOLATILE_KINDS, Fault, Injector, make_schedule
from .history import Phase, read_attempts
from .proxy import FreezableProxy
from .worker import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "chaos"
# Lock names that are easy to get wrong: braces (hash tags), escapes, non-ASCII, a separator.
NAMES = ("orders:42", "{braced}", "%7Bbraced%7D", "ключ-ü", "a}b{c")


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


CI = Profile(workers=4, tasks=25, durable=24.0, volatile=10.0)
LONG = Profile(workers=8, tasks=50, durable=480.0, volatile=120.0)


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    kinds: tuple[str, ...]
    config: dict[str, str]
    seconds: float


class WorkerProcess:
    """One ``tests.chaos.worker`` subprocess and its line protocol."""

    def __init__(self, process: asyncio.subprocess.Process, config: WorkerConfig) -> None:
        self.process = process
        self.config = config

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
        return cls(process, config)

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
    phase = Phase(spec.name)
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
    workers: list[WorkerProcess] = []
    try:
        for index, proxy in enumerate(proxies):
            port = await proxy.start()
            config = WorkerConfig(
                proc=index,
                url=f"redis://127.0.0.1:{port}/0",
                seed=seed,
                tasks=profile.tasks,
                names=list(NAMES),
                key_prefix=PREFIX,
                out=str(workdir / f"{spec.name}-{index}.jsonl"),
                watchdog_timeout=profile.watchdog_timeout,
                twitchy_timeout=profile.twitchy_timeout,
                cancel_rate=profile.cancel_rate,
                drain=profile.drain,
            )
            workers.append(
                await WorkerProcess.spawn(config, workdir / f"{spec.name}-{index}.stderr")
            )
        await asyncio.gather(*(worker.expect("READY", 60) for worker in workers))
        injector = Injector(server, proxies, seed=seed)
        start = time.monotonic_ns()
        await asyncio.gather(injector.run(schedule, start), asyncio.sleep(spec.seconds))
        await injector.heal()
        phase.faults, phase.amnesia = injector.events, injector.amnesia
        for worker in workers:
            worker.send("stop")
        drain = profile.drain + 15
        await asyncio.gather(*(worker.expect("DRAINED", drain) for worker in workers))
        phase.problems += await leftovers(server)
        for worker in workers:
            worker.send("close")
        for worker in workers:
            done = await worker.expect("DONE", 30)
            phase.problems += [f"worker {worker.config.proc}: {p}" for p in done["problems"]]
            _print_logs(worker.config.proc, done["logs"])
            await worker.finish()
            phase.attempts += read_attempts(Path(worker.config.out))
    finally:
        for worker in workers:
            if worker.process.returncode is None:
                worker.process.kill()
                await worker.process.wait()
        for proxy in proxies:
            await proxy.aclose()
        await asyncio.to_thread(server.stop)
    return phase


async def leftovers(server: EmbeddedServer, grace: float = 1.0) -> list[str]:
    """Lock hashes (meta hashes may stay: they keep the fencing counter) and subscriptions that
    remain once every worker has drained, after ``grace`` seconds for in-flight expiries."""
    async with Redis(host=server.host, port=server.port) as redis:
        deadline = time.monotonic() + grace
        while True:
            keys = [
                key
                async for key in redis.scan_iter(match=f"{PREFIX}:*")
                if not key.endswith(b":meta")
            ]
            channels = await redis.pubsub_channels(f"{PREFIX}:*")
            if (not keys and not channels) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        found = [f"lock key left behind: {key!r} (pttl {await redis.pttl(key)} ms)" for key in keys]
        found += [f"subscription left behind: {channel!r}" for channel in channels]
        return found


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


async def run(args: argparse.Namespace) -> int:
    profile = LONG if args.long else CI
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    mode = "long" if args.long else "ci"
    print(
        f"aiolock chaos run: mode {mode}, seed {seed}, server {args.server}, "
        f"{profile.workers} workers x {profile.tasks} tasks"
    )
    print(
        f"replay: python -m tests.chaos.run{' --long' if args.long else ''} --seed {seed} "
        f"--server {args.server}"
    )
    results: list[Phase] = []
    violations: list[Violation] = []
    with tempfile.TemporaryDirectory(prefix="aiolock-chaos-") as tmp:
        for index, spec in enumerate(phases(profile)):
            phase = await run_phase(spec, profile, seed + index, args.server, Path(tmp))
            results.append(phase)
            found = check_phase(phase, wait_slack=args.wait_slack)
            violations += found
            print(f"   {spec.name}: {len(phase.attempts)} attempts, {len(found)} violations")
    print("== summary")
    print(format_summary(summarize(results)))
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
    parser.add_argument("--long", action="store_true", help="8 workers x 50 tasks, ~10 minutes")
    parser.add_argument("--seed", type=int, help="replay the schedule of this seed")
    parser.add_argument("--server", choices=("valkey", "redis"), default="valkey")
    parser.add_argument(
        "--wait-slack", type=float, default=0.5, help="seconds a bounded wait may overrun"
    )
    parser.add_argument("--show", type=int, default=30, help="violations to print")
    return asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
