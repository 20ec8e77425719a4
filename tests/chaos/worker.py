"""One chaos worker process: many tasks taking random locks, every attempt recorded.

Started by :mod:`tests.chaos.run` as ``python -m tests.chaos.worker '<json config>'``.  It talks
to the orchestrator in lines: it prints ``READY``, waits for ``stop`` (finish the current
operations), prints ``DRAINED <stats>``, waits for ``close`` (close the clients), writes its
history and prints ``DONE <problems>``.  Problems are what the checker cannot see in the history:
warnings, loop errors ("Task exception was never retrieved"), unexpected exceptions, and what
the clients still track after the drain.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import random
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

import aiolock
from aiolock import LockLostError, LockNotOwnedError, LockTimeoutError

from .history import CANCELLED, GRANTED, LOST, OK, TIMEOUT, Attempt, write_attempts

__all__ = ["WorkerConfig"]


@dataclass(frozen=True)
class WorkerConfig:
    proc: int
    url: str
    seed: int
    tasks: int
    names: list[str]
    key_prefix: str
    out: str
    watchdog_timeout: float
    twitchy_timeout: float  # the socket timeout of the second client: redis-py resends
    cancel_rate: float
    drain: float


@dataclass
class Diagnostics:
    """Everything the process reports besides its history."""

    problems: list[str] = field(default_factory=list)
    library_logs: Counter[str] = field(default_factory=Counter)

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_exception_handler(self._on_loop_error)
        warnings.simplefilter("always")
        warnings.showwarning = self._on_warning  # type: ignore[assignment]
        sys.unraisablehook = self._on_unraisable
        library = logging.getLogger("aiolock")
        library.addHandler(_Counting(self))
        library.propagate = False
        logging.getLogger("asyncio").addHandler(_Problems(self))

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        where = "".join(traceback.format_exception(exc)[-6:]) if exc is not None else ""
        self.problems.append(f"event loop: {context.get('message')} {exc!r}\n{where}")

    def _on_warning(self, message: Warning | str, category: type[Warning], *args: Any) -> None:
        self.problems.append(f"warning: {category.__name__}: {message}")

    def _on_unraisable(self, unraisable: Any) -> None:
        self.problems.append(f"unraisable: {unraisable.err_msg}: {unraisable.exc_value!r}")


class _Counting(logging.Handler):
    def __init__(self, diagnostics: Diagnostics) -> None:
        super().__init__(logging.INFO)
        self._diagnostics = diagnostics

    def emit(self, record: logging.LogRecord) -> None:
        self._diagnostics.library_logs[f"{record.name} {record.levelname}"] += 1
        if record.levelno >= logging.ERROR:
            self._diagnostics.problems.append(f"log {record.name}: {record.getMessage()}")


class _Problems(logging.Handler):
    def __init__(self, diagnostics: Diagnostics) -> None:
        super().__init__(logging.ERROR)
        self._diagnostics = diagnostics

    def emit(self, record: logging.LogRecord) -> None:
        self._diagnostics.problems.append(f"log {record.name}: {record.getMessage()}")


def now() -> int:
    return time.monotonic_ns()


# -- one operation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    attempt: Attempt
    owner: str | None  # an explicit owner, or None for the task's own identity
    hold: float  # seconds the body runs


def make_plan(rng: random.Random, config: WorkerConfig, task: int, seq: int, client: str) -> Plan:
    mode = rng.choices(("acquire", "try_lock", "lock"), weights=(5, 3, 1))[0]
    lease = None if rng.random() < 0.5 else round(rng.uniform(0.4, 3.0), 2)
    wait: float | None = None
    if mode == "try_lock":
        wait = 0.0 if rng.random() < 0.3 else round(rng.uniform(0.05, 2.0), 2)
    elif mode == "acquire" and rng.random() < 0.8:
        wait = round(rng.uniform(0.0, 2.0), 2)
    roll = rng.random()
    if roll < 0.88:
        hold = rng.uniform(0.0, 0.02)
    elif roll < 0.97:
        hold = rng.uniform(0.05, 0.6)
    else:  # long enough for renewals, and for fixed leases to run out
        hold = rng.uniform(1.0, 2.5)
    owner = f"job-{config.proc}-{task}-{seq}" if rng.random() < 0.1 else None
    attempt = Attempt(
        proc=config.proc,
        task=task,
        seq=seq,
        client=client,
        name=rng.choice(config.names),
        mode=mode,
        wait=wait,
        lease=lease,
        t_start=now(),
    )
    return Plan(attempt, owner, hold)


def _granted(attempt: Attempt, token: int | None) -> None:
    attempt.t_done = attempt.t_grant = now()
    attempt.result = GRANTED
    attempt.token = token


async def _body(attempt: Attempt, seconds: float, lost: Callable[[], bool]) -> None:
    try:
        await asyncio.sleep(seconds)
    finally:
        attempt.t_end = now()
        attempt.lost_in_body = lost()


async def _guarded(lock: aiolock.AsyncRLock, plan: Plan) -> None:
    """``async with lock.acquire(...) as guard``: the guard reports the loss."""
    attempt = plan.attempt
    guard: aiolock.LockGuard | None = None
    try:
        async with lock.acquire(wait=attempt.wait, lease=attempt.lease) as guard:
            _granted(attempt, guard.fencing_token)
            await _body(attempt, plan.hold, lambda: guard is not None and guard.lost)
    finally:
        if guard is not None:
            attempt.lost = guard.lost


async def _plain(lock: aiolock.AsyncRLock, plan: Plan) -> None:
    """``try_lock``/``lock`` then ``unlock``: ``LockNotOwnedError`` reports the loss."""
    attempt = plan.attempt
    if attempt.mode == "lock":
        await lock.lock(lease=attempt.lease)
    elif not await lock.try_lock(wait=attempt.wait, lease=attempt.lease):
        attempt.t_done = now()
        attempt.result = TIMEOUT
        return
    # No public call returns the token of a try_lock() grant: read the client's own record.
    owner, _ = lock._owner()
    hold = lock._services.holds.get(lock._keys.lock, owner)
    _granted(attempt, None if hold is None else hold.token)
    try:
        await _body(attempt, plan.hold, lambda: hold is None or hold.lost)
    finally:
        try:
            await lock.unlock()
        finally:
            attempt.lost = hold is None or hold.lost


async def run_operation(lock: aiolock.AsyncRLock, plan: Plan, diagnostics: Diagnostics) -> None:
    attempt = plan.attempt
    try:
        await (_guarded if attempt.mode == "acquire" else _plain)(lock, plan)
    except BaseException as exc:
        _classify(attempt, exc, diagnostics)
        if isinstance(exc, asyncio.CancelledError):
            raise
    else:
        if attempt.granted:
            attempt.outcome = OK


def _classify(attempt: Attempt, exc: BaseException, diagnostics: Diagnostics) -> None:
    if isinstance(exc, LockTimeoutError):
        text = TIMEOUT
    elif isinstance(exc, LockLostError | LockNotOwnedError):
        text = LOST
    elif isinstance(exc, asyncio.CancelledError):
        text = CANCELLED
    else:
        text = f"error:{type(exc).__name__}"
        if not isinstance(exc, RedisError | OSError):
            trace = "".join(traceback.format_exception(exc))
            diagnostics.problems.append(f"{attempt.label}: unexpected exception\n{trace}")
    if attempt.granted:
        attempt.outcome = text
    else:
        attempt.t_done = now()
        attempt.result = text


# -- the process -----------------------------------------------------------------------------


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.diagnostics = Diagnostics()
        self.history: list[Attempt] = []
        self.current: dict[int, Attempt] = {}  # each task's attempt in progress
        self.stopping = asyncio.Event()
        prefix, watchdog = config.key_prefix, config.watchdog_timeout
        self.clients = {
            "steady": aiolock.Client.from_url(
                config.url, key_prefix=prefix, watchdog_timeout=watchdog
            ),
            "twitchy": aiolock.Client.from_url(
                config.url,
                key_prefix=prefix,
                watchdog_timeout=watchdog,
                socket_timeout=config.twitchy_timeout,
                socket_connect_timeout=config.twitchy_timeout,
            ),
        }

    async def task_loop(self, task: int) -> None:
        rng = random.Random(f"{self.config.seed}/{self.config.proc}/{task}")
        kind = ("steady", "twitchy")[task % 2]
        client = self.clients[kind]
        for seq in itertools.count():
            if self.stopping.is_set():
                return
            plan = make_plan(rng, self.config, task, seq, kind)
            self.history.append(plan.attempt)
            self.current[task] = plan.attempt
            lock = client.lock(plan.attempt.name, owner=plan.owner)
            cancel_after = rng.uniform(0, 1.0) if rng.random() < self.config.cancel_rate else None
            operation = asyncio.create_task(run_operation(lock, plan, self.diagnostics))
            try:
                done, _ = await asyncio.wait([operation], timeout=cancel_after)
                if not done:
                    operation.cancel()
                    await asyncio.wait([operation])
            finally:
                operation.cancel()
            if not operation.cancelled() and operation.exception() is not None:
                self.diagnostics.problems.append(f"operation failed: {operation.exception()!r}")
            await asyncio.sleep(rng.uniform(0.0, 0.05))

    async def run(self) -> None:
        self.diagnostics.install(asyncio.get_running_loop())
        tasks = [asyncio.create_task(self.task_loop(index)) for index in range(self.config.tasks)]
        _emit("READY")
        await _expect("stop")
        self.stopping.set()
        _, stranded = await asyncio.wait(tasks, timeout=self.config.drain)
        for index, task in enumerate(tasks):
            if task in stranded:
                attempt = self.current[index]
                self.diagnostics.problems.append(
                    f"stranded: {attempt.label} ({attempt.mode} {attempt.name!r}, "
                    f"{attempt.result}) still running {self.config.drain}s after the stop"
                )
                task.cancel()
        if stranded:
            await asyncio.wait(stranded)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                self.diagnostics.problems.append(f"task loop failed: {task.exception()!r}")
        stats = await self._quiesce()
        _emit("DRAINED", stats)
        await _expect("close")
        for client in self.clients.values():
            await client.aclose()
        del tasks, stranded
        gc.collect()
        await asyncio.sleep(0)
        write_attempts(Path(self.config.out), self.history)
        _emit(
            "DONE",
            {"problems": self.diagnostics.problems, "logs": dict(self.diagnostics.library_logs)},
        )

    async def _quiesce(self) -> dict[str, Any]:
        """Wait until the clients hold, wait for and subscribe to nothing (or report it)."""
        deadline = time.monotonic() + 10.0
        while True:
            stats = {kind: client.statistics() for kind, client in self.clients.items()}
            busy = {
                kind: asdict(s)
                for kind, s in stats.items()
                if s.holds or s.waiters or s.subscriptions or s.pending
            }
            if not busy:
                return {kind: asdict(s) for kind, s in stats.items()}
            if time.monotonic() > deadline:
                self.diagnostics.problems.append(f"clients still busy after the drain: {busy}")
                return busy
            await asyncio.sleep(0.05)


def _emit(word: str, payload: object = None) -> None:
    line = word if payload is None else f"{word} {json.dumps(payload)}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _expect(word: str) -> None:
    line = await asyncio.to_thread(sys.stdin.readline)
    if line.strip() != word:
        raise SystemExit(f"worker expected {word!r} from the orchestrator, got {line!r}")


async def _main(config: WorkerConfig) -> None:
    await Worker(config).run()


def main() -> None:
    asyncio.run(_main(WorkerConfig(**json.loads(sys.argv[1]))))


if __name__ == "__main__":
    main()
