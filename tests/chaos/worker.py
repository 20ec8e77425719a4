"""One chaos worker process: many tasks taking random locks, every attempt recorded.

Each operation picks a lock kind (``lock``, ``fair_lock``, ``spin_lock``, the read or the write
mode of ``rw_lock``, ``semaphore``, ``MultiLock`` or ``RedLock``), a name, an owner (the task's,
or an explicit one) and a mode: ``acquire()`` as a block, ``try_lock``/``lock`` then ``unlock``,
or "nested": an ``acquire()`` block that re-enters the lock once or twice inside (``acquire()`` and
``try_lock``/``unlock``), each reentry recorded with its token and count.  A read-write lock's
reentries take either mode: a read inside a write block is a fresh read hold (legal: the writer
may read), a write inside a read block is refused at once (``LockError``, by design).  A
semaphore's modes are ``acquire()`` as a block ("acquire") and ``try_acquire`` then
``permit.release()`` ("try_acquire"; its ``wait=None`` waits forever).  A ``MultiLock`` holds
two single locks (plain, fair or spin; each of its own name, the second of any of the three
clients); a ``RedLock`` holds a majority of three "servers": the task's client and two clients
sharing its connections under key prefixes of their own (so every fault hits them together,
but for a cut request or a killed connection).  Composites are not re-entered here (mode
"nested" is "acquire" for them; the contract suite tests their reentrancy); each part granted
is recorded (:class:`~tests.chaos.history.Part`).
Three clients share the tasks: steady and twitchy (a 0.25 s socket timeout) resend through
redis-py's ``Retry``, brittle never resends.  A probe samples the event loop's lag throughout.

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
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import RedisClusterException, RedisError, ResponseError

import aiolock
from aiolock import (
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockSyncError,
    LockTimeoutError,
)
from aiolock._core.holds import Hold
from aiolock._core.kind import LockKind
from aiolock.client import Client
from aiolock.semaphore import hold_of
from tests.helpers import services_of

from .history import (
    CANCELLED,
    FAIR,
    GRANTED,
    LOCK,
    LOST,
    MULTI,
    OK,
    PERMITS,
    READ,
    REDLOCK,
    REDLOCK_SERVERS,
    SEMAPHORE,
    SPIN,
    TIMEOUT,
    WRITE,
    Attempt,
    Part,
    Reentry,
    attempt_line,
    write_attempts,
)

__all__ = ["WorkerConfig", "redlock_prefixes"]


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
    twitchy_timeout: float  # the socket timeout of the second client (it resends)
    cancel_rate: float
    drain: float
    cluster: bool = False  # the URL names a node of a Redis Cluster
    sync_replicas: int = 0  # every client's grants wait for this many replicas


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
        # The owner ties the record to the attempts in the history (their "owner").
        owner = getattr(record, "aiolock_owner", None)
        if record.levelno >= logging.WARNING:
            # Into the worker's stderr file, which ``--keep`` keeps with the histories: what
            # the library said before a diagnostic, in order, for the post-mortem.
            whose = f" (owner {owner})" if owner else ""
            line = f"{now()} {record.levelname} {record.name}: {record.getMessage()}{whose}"
            print(line, file=sys.stderr)
        if record.levelno >= logging.ERROR:
            at = f" (owner {owner}, at {now()} ns)" if owner else ""
            self._diagnostics.problems.append(f"log {record.name}: {record.getMessage()}{at}")


class _Problems(logging.Handler):
    def __init__(self, diagnostics: Diagnostics) -> None:
        super().__init__(logging.ERROR)
        self._diagnostics = diagnostics

    def emit(self, record: logging.LogRecord) -> None:
        self._diagnostics.problems.append(f"log {record.name}: {record.getMessage()}")


def now() -> int:
    return time.monotonic_ns()


# -- one operation ---------------------------------------------------------------------------

# The CI run makes about 3400 grants in all: each weight unit is about 250 of them.
KIND_WEIGHTS = {LOCK: 3, FAIR: 2, SPIN: 1, READ: 2, WRITE: 2, SEMAPHORE: 2, MULTI: 1, REDLOCK: 1}
MULTI_PARTS = (LOCK, FAIR, SPIN)  # the kinds a MultiLock's parts are drawn from
MODE_WEIGHTS = {"acquire": 5, "try_lock": 3, "lock": 1, "nested": 3}
CLIENTS = ("steady", "twitchy", "brittle")
NESTED_OWNER = "nest-"  # the prefix of the explicit owners of half the nested holders
# A reentry's result when it asked for the write lock while its owner held only reads: the
# library refuses that at once with LockError, by design (an upgrade could deadlock).
REFUSED = "refused"


# When each hold was granted (monotonic ns), by id(hold): a composite's parts are granted one
# by one (MultiLock) or at once (RedLock), before the composite's own grant.  Every client's
# hold registry stamps its grants here (see Worker.__init__).
GRANT_TIMES: dict[int, int] = {}


def stamp_grants(client: Client) -> None:
    """Record the time of each grant that ``client`` registers, in GRANT_TIMES."""
    holds = services_of(client).holds
    record_grant = holds.record_grant

    def stamped(*args: Any, **kwargs: Any) -> Hold:
        hold = record_grant(*args, **kwargs)
        GRANT_TIMES[id(hold)] = now()
        return hold

    holds.record_grant = stamped  # type: ignore[method-assign]


def redlock_prefixes(key_prefix: str) -> list[str]:
    """The key prefixes of a RedLock's servers: the worker's own, then one per extra client."""
    return [key_prefix] + [f"{key_prefix}-redlock{k}" for k in range(1, REDLOCK_SERVERS)]


def redlock_part(index: int) -> str:
    """The resource kind of a RedLock's part on server ``index`` (see history.REDLOCK)."""
    return LOCK if index == 0 else f"{REDLOCK}{index}"


@dataclass(frozen=True)
class ReentryPlan:
    call: str  # "acquire" or "try_lock"
    wait: float | None
    lease: float | None
    seconds: float  # how long its own block runs
    kind: str | None = None  # READ or WRITE inside a read-write hold; None: the outer's kind


@dataclass(frozen=True)
class Plan:
    attempt: Attempt
    owner: str | None  # an explicit owner, or None for the task's own identity
    hold: float  # seconds the body runs
    reentries: tuple[ReentryPlan, ...] = ()  # mode "nested": made first in the body
    parts: tuple[tuple[str, str, str], ...] = ()  # MULTI: (kind, name, client) of each lock


def make_plan(rng: random.Random, config: WorkerConfig, task: int, seq: int, client: str) -> Plan:
    kind = rng.choices(tuple(KIND_WEIGHTS), weights=tuple(KIND_WEIGHTS.values()))[0]
    mode = rng.choices(tuple(MODE_WEIGHTS), weights=tuple(MODE_WEIGHTS.values()))[0]
    if kind == SEMAPHORE:  # not reentrant: a block, or try_acquire (wait=None: forever)
        mode = "acquire" if mode in ("acquire", "nested") else "try_acquire"
    if kind in (MULTI, REDLOCK) and mode == "nested":
        mode = "acquire"
    parts: tuple[tuple[str, str, str], ...] = ()
    if kind == MULTI:
        first, second = rng.sample([(k, n) for k in MULTI_PARTS for n in config.names], 2)
        parts = ((*first, client), (*second, rng.choice(CLIENTS)))
    lease = None if rng.random() < 0.5 else round(rng.uniform(0.4, 3.0), 2)
    wait: float | None = None
    if mode == "try_lock":
        wait = 0.0 if rng.random() < 0.3 else round(rng.uniform(0.05, 2.0), 2)
    elif mode in ("acquire", "nested") and rng.random() < 0.8:
        wait = round(rng.uniform(0.0, 2.0), 2)
    roll = rng.random()
    if roll < 0.88:
        hold = rng.uniform(0.0, 0.02)
    elif roll < 0.97:
        hold = rng.uniform(0.05, 0.6)
    else:  # long enough for renewals, and for fixed leases to run out
        hold = rng.uniform(1.0, 2.5)
    reentries: list[ReentryPlan] = []
    if mode == "nested":
        for _ in range(rng.choice((1, 2))):
            call = rng.choice(("acquire", "try_lock"))
            inner_wait = rng.choice((0.0, round(rng.uniform(0.05, 1.0), 2), None))
            if call == "try_lock" and inner_wait is None:
                inner_wait = 0.0
            inner_lease = rng.choice((None, lease))
            inner_kind = rng.choice((READ, WRITE)) if kind in (READ, WRITE) else None
            reentries.append(
                ReentryPlan(call, inner_wait, inner_lease, rng.uniform(0.0, 0.01), inner_kind)
            )
    owner = f"job-{config.proc}-{task}-{seq}" if rng.random() < 0.1 else None
    if mode == "nested" and rng.random() < 0.5:
        # Recognisable on the wire: the cut-request fault can aim at nested holders' calls.
        owner = f"{NESTED_OWNER}{config.proc}-{task}-{seq}"
    attempt = Attempt(
        proc=config.proc,
        task=task,
        seq=seq,
        client=client,
        name="+".join(name for _, name, _ in parts) if parts else rng.choice(config.names),
        mode=mode,
        wait=wait,
        lease=lease,
        t_start=now(),
        kind=kind,
    )
    return Plan(attempt, owner, hold, tuple(reentries), parts)


def _granted(attempt: Attempt | Reentry, token: int | None, lock: LockKind) -> None:
    attempt.t_done = attempt.t_grant = now()
    attempt.result = GRANTED
    attempt.token = token
    hold = _hold_of(lock)  # its count is the server's, from the grant's reply
    attempt.count = None if hold is None else hold.count


async def _body(
    attempt: Attempt,
    seconds: float,
    lost: Callable[[], bool],
    first: Coroutine[Any, Any, None] | None = None,
) -> None:
    try:
        if first is not None:
            await first
        await asyncio.sleep(seconds)
    finally:
        if first is not None:
            first.close()  # never started (cancelled before): no "never awaited" warning
        attempt.t_end = now()
        attempt.lost_in_body = lost()


async def _guarded(lock: LockKind, plan: Plan, diagnostics: Diagnostics) -> None:
    """``async with lock.acquire(...) as guard``: the guard reports the loss.

    Mode "nested": the body first re-enters the lock (``plan.reentries``), each reentry
    recorded on its own; a reentry that fails is recorded and the body goes on, as code that
    handles the error of a nested call would.
    """
    attempt = plan.attempt
    guard: aiolock.LockGuard[int] | None = None
    try:
        async with lock.acquire(wait=attempt.wait, lease=attempt.lease) as guard:
            _granted(attempt, guard.fencing_token, lock)
            # The reentries are part of the body: a loss they revealed counts as known in it.
            await _body(
                attempt,
                plan.hold,
                lambda: guard is not None and guard.lost,
                _reentries(lock, attempt, plan.reentries, guard, diagnostics),
            )
    finally:
        if guard is not None:
            attempt.lost = guard.lost


async def _reentries(
    lock: LockKind,
    attempt: Attempt,
    plans: tuple[ReentryPlan, ...],
    guard: aiolock.LockGuard[int],
    diagnostics: Diagnostics,
) -> None:
    for spec in plans:
        entry = Reentry(spec.call, spec.wait, now(), kind=spec.kind)
        attempt.nested.append(entry)
        inner = _other_mode(lock) if spec.kind not in (None, attempt.kind) else lock
        # Asking for the write lock while holding only reads is refused at once, by design.
        refusal = attempt.kind == READ and spec.kind == WRITE
        await _reenter(
            inner,
            entry,
            spec,
            guard,
            diagnostics=diagnostics,
            label=attempt.label,
            refusal=refusal,
        )


def _other_mode(lock: LockKind) -> LockKind:
    """The other mode of a read-write lock, for the same owner (explicit, or the task's)."""
    rw = aiolock.AsyncReadWriteLock(lock.services, lock.name)
    owner = lock.explicit_owner
    if isinstance(lock, aiolock.AsyncReadLock):
        return rw.write_lock(owner=owner)
    return rw.read_lock(owner=owner)


async def _reenter(
    lock: LockKind,
    entry: Reentry,
    spec: ReentryPlan,
    holder: aiolock.LockGuard[int],
    *,
    diagnostics: Diagnostics,
    label: str,
    refusal: bool = False,
) -> None:
    """One nested acquisition by the holder of ``lock`` (see :class:`Reentry`); ``refusal``:
    a ``LockError`` (not one of its subclasses) is the expected outcome, recorded as REFUSED."""
    lease, seconds = spec.lease, spec.seconds

    def granted(token: int | None) -> None:
        _granted(entry, token, lock)
        entry.holder_lost = holder.lost  # what the holder knew when the call returned

    try:
        if entry.call == "acquire":
            inner: aiolock.LockGuard[int] | None = None
            try:
                async with lock.acquire(wait=entry.wait, lease=lease) as inner:
                    granted(inner.fencing_token)
                    await _inner_body(entry, seconds, lambda: inner is not None and inner.lost)
            finally:
                if inner is not None:
                    entry.lost = inner.lost
        else:
            assert entry.wait is not None
            if not await lock.try_lock(wait=entry.wait, lease=lease):
                entry.t_done = now()
                entry.result = TIMEOUT
                return
            hold = _hold_of(lock)
            granted(None if hold is None else hold.token)
            try:
                await _inner_body(entry, seconds, lambda: hold is None or hold.check_lost())
            finally:
                try:
                    await lock.unlock()
                finally:
                    entry.lost = hold is None or hold.check_lost()
    except asyncio.CancelledError as exc:
        _classify(entry, exc, diagnostics, label)
        raise
    except LockError as exc:
        if refusal and type(exc) is LockError and not entry.granted:
            entry.t_done = now()
            entry.result = REFUSED
        else:
            _classify(entry, exc, diagnostics, label)
    except Exception as exc:  # recorded; the outer body goes on
        _classify(entry, exc, diagnostics, label)
    else:
        if entry.granted:
            entry.outcome = OK


async def _inner_body(entry: Reentry, seconds: float, lost: Callable[[], bool]) -> None:
    try:
        await asyncio.sleep(seconds)
    finally:
        entry.t_end = now()
        entry.lost_in_body = lost()


def _hold_of(lock: LockKind) -> Hold | None:
    """The calling owner's hold in the client's registry: no public call returns the token of a
    ``try_lock()`` grant."""
    owner, _ = lock.current_owner()
    return lock.hold(owner)


async def _plain(lock: LockKind, plan: Plan, diagnostics: Diagnostics) -> None:
    """``try_lock``/``lock`` then ``unlock``: ``LockNotOwnedError`` reports the loss."""
    attempt = plan.attempt
    if attempt.mode == "lock":
        await lock.lock(lease=attempt.lease)
    elif not await lock.try_lock(wait=attempt.wait, lease=attempt.lease):
        attempt.t_done = now()
        attempt.result = TIMEOUT
        return
    hold = _hold_of(lock)
    _granted(attempt, None if hold is None else hold.token, lock)
    try:
        await _body(attempt, plan.hold, lambda: hold is None or hold.check_lost())
    finally:
        try:
            await lock.unlock()
        finally:
            attempt.lost = hold is None or hold.check_lost()
            if attempt.lost:  # the library's reason: which path found the loss
                attempt.lost_reason = _reason(hold)


async def _permit(semaphore: aiolock.AsyncSemaphore, plan: Plan, diagnostics: Diagnostics) -> None:
    """A semaphore's permit: ``acquire()`` as a block (``LockLostError`` on exit reports the
    loss), or ``try_acquire`` then ``permit.release()`` (``LockNotOwnedError`` reports it)."""
    attempt = plan.attempt

    def granted(permit: aiolock.Permit) -> None:
        attempt.t_done = attempt.t_grant = now()
        attempt.result = GRANTED
        attempt.owner = permit.id

    if attempt.mode == "acquire":
        held: aiolock.Permit | None = None
        try:
            async with semaphore.acquire(wait=attempt.wait, lease=attempt.lease) as held:
                granted(held)
                await _body(attempt, plan.hold, lambda: held is not None and held.lost)
        finally:
            if held is not None:
                attempt.lost = held.lost
                if held.lost:
                    attempt.lost_reason = _reason(hold_of(held))
        return
    permit = await semaphore.try_acquire(wait=attempt.wait, lease=attempt.lease)
    if permit is None:
        attempt.t_done = now()
        attempt.result = TIMEOUT
        return
    granted(permit)
    try:
        await _body(attempt, plan.hold, lambda: permit.lost)
    finally:
        try:
            await permit.release()
        finally:
            attempt.lost = permit.lost
            if permit.lost:
                attempt.lost_reason = _reason(hold_of(permit))


def _reason(hold: Hold | None) -> str:
    """Why the client took ``hold`` for lost, as the library recorded it."""
    if hold is None:
        return "no hold was registered after the grant (lost at once, and forgotten)"
    return f"{hold.lost_reason} (from the hold)"


Composite = aiolock.MultiLock | aiolock.RedLock


async def _composite(lock: Composite, plan: Plan, diagnostics: Diagnostics) -> None:
    """A ``MultiLock`` or ``RedLock``: ``acquire()`` as a block (the guard reports the loss),
    or ``try_lock``/``lock`` then ``unlock``; each part granted is recorded with its own
    token, count and losses (a part's loss is its hold's flag, set by its client)."""
    attempt = plan.attempt
    multi = isinstance(lock, aiolock.MultiLock)
    singles = list(lock.locks) if isinstance(lock, aiolock.MultiLock) else list(lock.parts)
    needed = len(singles) if isinstance(lock, aiolock.MultiLock) else lock.quorum
    held: list[tuple[Part, Hold]] = []

    def granted(token: object) -> None:
        attempt.t_done = attempt.t_grant = now()
        attempt.result = GRANTED
        for index, single in enumerate(singles):
            hold = _hold_of(single)  # right after the grant: no await in between
            if hold is None:
                continue
            if multi:
                kind, name, client = plan.parts[index]
            else:
                kind, name, client = redlock_part(index), attempt.name, attempt.client
            part = Part(kind, name, client, hold.token, hold.count)
            part.t_grant = GRANT_TIMES.get(id(hold))
            held.append((part, hold))
        attempt.parts = [part for part, _ in held]
        tokens = [part.token for part in attempt.parts]
        expected = tuple(tokens) if multi else max(tokens, default=None)
        if token is not None and token != expected:
            diagnostics.problems.append(
                f"{attempt.label}: {attempt.kind} guard token {token} is not {expected} (parts)"
            )
        attempt.token = None if multi else max(tokens, default=None)

    def lost() -> bool:
        return sum(not hold.check_lost() for _, hold in held) < needed

    async def body(lost: Callable[[], bool]) -> None:
        try:
            await asyncio.sleep(plan.hold)
        finally:
            attempt.t_end = now()
            attempt.lost_in_body = lost()
            for part, hold in held:
                part.lost_in_body = hold.check_lost()

    def ended(lost: bool) -> None:
        attempt.lost = lost
        for part, hold in held:
            part.lost = hold.check_lost()

    if attempt.mode == "acquire":
        guard: aiolock.LockGuard[Any] | None = None
        try:
            async with lock.acquire(wait=attempt.wait, lease=attempt.lease) as guard:
                granted(guard.fencing_token)
                await body(lambda: guard is not None and guard.lost)
        finally:
            if guard is not None:
                ended(guard.lost)
        return
    if attempt.mode == "lock":
        await lock.lock(lease=attempt.lease)
    elif not await lock.try_lock(wait=attempt.wait, lease=attempt.lease):
        attempt.t_done = now()
        attempt.result = TIMEOUT
        return
    granted(None)
    try:
        await body(lost)
    finally:
        try:
            await lock.unlock()
        finally:
            ended(lost())


def _make_lock(client: aiolock.Client, plan: Plan) -> LockKind:
    name, owner = plan.attempt.name, plan.owner
    match plan.attempt.kind:
        case "fair":
            return client.fair_lock(name, owner=owner)
        case "spin":
            return client.spin_lock(name, owner=owner)
        case "read":
            return client.rw_lock(name).read_lock(owner=owner)
        case "write":
            return client.rw_lock(name).write_lock(owner=owner)
    return client.lock(name, owner=owner)


async def run_operation(
    client: aiolock.Client,
    plan: Plan,
    diagnostics: Diagnostics,
    composite: Callable[[Plan], Composite] | None = None,
) -> None:
    """``composite``: makes the plan's ``MultiLock`` or ``RedLock`` (it needs more clients)."""
    attempt = plan.attempt
    attempt.t_call = now()  # the library's own deadline starts here
    guarded = attempt.mode in ("acquire", "nested")
    try:
        if attempt.kind == SEMAPHORE:
            await _permit(client.semaphore(attempt.name, PERMITS), plan, diagnostics)
        elif attempt.kind in (MULTI, REDLOCK):
            assert composite is not None
            await _composite(composite(plan), plan, diagnostics)
        else:
            lock = _make_lock(client, plan)
            attempt.owner, _ = lock.current_owner()  # this task's, or the explicit one
            await (_guarded if guarded else _plain)(lock, plan, diagnostics)
    except BaseException as exc:
        _classify(attempt, exc, diagnostics, attempt.label)
        if isinstance(exc, asyncio.CancelledError):
            raise
    else:
        if attempt.granted:
            attempt.outcome = OK


def _classify(
    attempt: Attempt | Reentry, exc: BaseException, diagnostics: Diagnostics, label: str
) -> None:
    if isinstance(exc, LockTimeoutError):
        text = TIMEOUT
    elif isinstance(exc, LockLostError | LockNotOwnedError):
        text = LOST
        if isinstance(attempt, Attempt):  # the library's reason: which path found the loss
            attempt.lost_reason = str(exc)
    elif isinstance(exc, asyncio.CancelledError):
        text = CANCELLED
    else:
        text = f"error:{type(exc).__name__}"
        if isinstance(exc, ResponseError):  # which one: printed with the library's log counts
            diagnostics.library_logs[f"caller {type(exc).__name__}: {str(exc)[:80]}"] += 1
        # LockSyncError: a grant the replicas did not confirm (a primary killed under it).
        if not isinstance(exc, RedisError | OSError | LockSyncError | RedisClusterException):
            trace = "".join(traceback.format_exception(exc))
            diagnostics.problems.append(f"{label}: unexpected exception\n{trace}")
    if attempt.granted:
        attempt.outcome = text
    else:
        attempt.t_done = now()
        attempt.result = text


# -- the process -----------------------------------------------------------------------------


def _resends() -> Retry:
    """redis-py resends a call whose connection failed or whose reply timed out, 3 times."""
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 3)


class LagProbe:
    """Event-loop lag: how late a ``sleep(period)`` wakes up, sampled all along the run.

    A wait that overran its bound by about the time its process's loop was blocked meanwhile
    was the machine's doing (the loop could not run the deadline's callback sooner); an
    overrun well beyond it was the library's.  Each sample also records the CPU time this
    process used over the interval: a blocked loop that used about as much CPU as wall time
    was busy with its own work; one that used little was waiting for a core.  The samples go
    to ``<out>.lag`` as (time, lag, cpu) triples, in ns.  Garbage-collector pauses are summed,
    and those of a millisecond or more go to ``<out>.gc`` as (start, end) pairs, in the
    history's clock: a late loss in a loop the collector stopped is told apart by the checker.
    """

    def __init__(self, period: float = 0.05) -> None:
        self.period = period
        self.samples: list[tuple[int, int, int]] = []  # (monotonic ns at wake-up, lag, cpu)
        self.gc_pauses: list[int] = []  # ns
        self.gc_spans: list[tuple[int, int]] = []  # (monotonic ns, ns) of pauses >= 1 ms
        self._gc_started = 0
        self._gc_started_at = 0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
            self._gc_started_at = now()
        elif self._gc_started:
            pause = time.perf_counter_ns() - self._gc_started
            self.gc_pauses.append(pause)
            if pause >= 1_000_000:
                self.gc_spans.append((self._gc_started_at, self._gc_started_at + pause))

    async def run(self) -> None:
        period_ns = round(self.period * 1e9)
        gc.callbacks.append(self._on_gc)
        try:
            while True:
                before, cpu = now(), time.process_time_ns()
                await asyncio.sleep(self.period)
                after = now()
                lag = max(0, after - before - period_ns)
                self.samples.append((after, lag, time.process_time_ns() - cpu))
        finally:
            gc.callbacks.remove(self._on_gc)

    def summary(self) -> dict[str, float]:
        lags = sorted(lag for _, lag, _ in self.samples)
        if not lags:
            return {}

        def pick(q: float) -> float:
            return lags[min(len(lags) - 1, int(q * len(lags)))] / 1e9

        blocked = [(lag, cpu) for _, lag, cpu in self.samples if lag > 100_000_000]
        return {
            "samples": len(lags),
            "mean": sum(lags) / len(lags) / 1e9,
            "p50": pick(0.5),
            "p99": pick(0.99),
            "max": lags[-1] / 1e9,
            "over_100ms": len(blocked) / len(lags),
            # Over the samples with lag > 100 ms: the CPU this process used / their wall time.
            "blocked_cpu": (
                sum(cpu for _, cpu in blocked)
                / max(1, sum(lag + round(self.period * 1e9) for lag, _ in blocked))
            ),
            "gc_max": max(self.gc_pauses, default=0) / 1e9,
            "gc_total": sum(self.gc_pauses) / 1e9,
        }

    def write(self, path: Path) -> None:
        """The samples to ``path`` (``<out>.lag``), the collector's pauses beside it (``.gc``)."""
        path.write_text(json.dumps(self.samples))
        path.with_suffix(".gc").write_text(json.dumps(self.gc_spans))


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.diagnostics = Diagnostics()
        # A finished attempt is kept as its JSON line: a string the garbage collector never
        # walks.  Kept as objects, the 20,000+ attempts of a long run made each full
        # collection walk them all, and the worker's own pauses (up to a second on a loaded
        # machine) showed up as the library's late losses and overrun waits.
        self.history: list[Attempt | str] = []
        self.current: dict[int, Attempt] = {}  # each task's attempt in progress
        self.stopping = asyncio.Event()
        prefix, watchdog = config.key_prefix, config.watchdog_timeout
        # redis-py 8's Redis.from_url makes connections that never resend (Retry with 0
        # retries, unlike the Redis() constructor's 10): the steady and twitchy clients ask for
        # resends explicitly, so that the scripts' idempotence per request id is exercised.
        self.clients = {
            "steady": aiolock.Client.from_url(
                config.url,
                key_prefix=prefix,
                watchdog_timeout=watchdog,
                retry=_resends(),
                cluster=config.cluster,
                sync_replicas=config.sync_replicas,
            ),
            "twitchy": aiolock.Client.from_url(
                config.url,
                key_prefix=prefix,
                watchdog_timeout=watchdog,
                socket_timeout=config.twitchy_timeout,
                socket_connect_timeout=config.twitchy_timeout,
                retry=_resends(),
                cluster=config.cluster,
                sync_replicas=config.sync_replicas,
            ),
            # No resends: a reply cut off after the script ran (the cut-request fault) reaches
            # the library as an unknown outcome, which it must settle, not as a resend.
            "brittle": aiolock.Client.from_url(
                config.url,
                key_prefix=prefix,
                watchdog_timeout=watchdog,
                retry=Retry(NoBackoff(), 0),
                cluster=config.cluster,
                sync_replicas=config.sync_replicas,
            ),
        }
        # A RedLock's servers for each client: the client, then clients sharing its connections
        # (so its socket timeout and resends) under key prefixes of their own.
        self.servers = {
            kind: [
                client,
                *(
                    aiolock.Client(
                        client.redis,
                        key_prefix=prefix,
                        watchdog_timeout=watchdog,
                        sync_replicas=config.sync_replicas,
                    )
                    for prefix in redlock_prefixes(prefix)[1:]
                ),
            ]
            for kind, client in self.clients.items()
        }
        for one in self.all_clients().values():
            stamp_grants(one)
        self.lag = LagProbe()

    def all_clients(self) -> dict[str, Client]:
        """Every client by label: the three, and the RedLock servers they share connections with."""
        found = dict(self.clients)
        for kind, servers in self.servers.items():
            found |= {f"{kind}-redlock{k}": server for k, server in enumerate(servers) if k}
        return found

    def composite(self, plan: Plan) -> Composite:
        attempt = plan.attempt
        if attempt.kind == REDLOCK:
            return aiolock.RedLock(self.servers[attempt.client], attempt.name, owner=plan.owner)
        locks = []
        for kind, name, client in plan.parts:
            made = self.clients[client]
            maker = {LOCK: made.lock, FAIR: made.fair_lock, SPIN: made.spin_lock}[kind]
            locks.append(maker(name, owner=plan.owner))
        return aiolock.MultiLock(*locks)

    async def task_loop(self, task: int) -> None:
        rng = random.Random(f"{self.config.seed}/{self.config.proc}/{task}")
        kind = CLIENTS[task % len(CLIENTS)]
        client = self.clients[kind]
        for seq in itertools.count():
            if self.stopping.is_set():
                return
            plan = make_plan(rng, self.config, task, seq, kind)
            index = len(self.history)
            self.history.append(plan.attempt)
            self.current[task] = plan.attempt
            cancel_after = rng.uniform(0, 1.0) if rng.random() < self.config.cancel_rate else None
            operation = asyncio.create_task(
                run_operation(client, plan, self.diagnostics, self.composite)
            )
            try:
                done, _ = await asyncio.wait([operation], timeout=cancel_after)
                if not done:
                    operation.cancel()
                    await asyncio.wait([operation])
            finally:
                operation.cancel()
            self.history[index] = attempt_line(plan.attempt)  # final: the operation is over
            if not operation.cancelled() and operation.exception() is not None:
                self.diagnostics.problems.append(f"operation failed: {operation.exception()!r}")
            await asyncio.sleep(rng.uniform(0.0, 0.05))

    async def run(self) -> None:
        self.diagnostics.install(asyncio.get_running_loop())
        # What the imports and the clients made stays: no full collection need walk it again
        # (some 80,000 objects, tens of ms a collection, more on a loaded machine).
        gc.collect()
        gc.freeze()
        probe = asyncio.create_task(self.lag.run())
        tasks = [asyncio.create_task(self.task_loop(index)) for index in range(self.config.tasks)]
        _emit("READY")
        await _expect("stop")
        self.stopping.set()
        _, stranded = await asyncio.wait(tasks, timeout=self.config.drain)
        for index, task in enumerate(tasks):
            if task in stranded:
                attempt = self.current[index]
                self.diagnostics.problems.append(
                    f"stranded: {attempt.label} ({attempt.client} {attempt.kind} {attempt.mode} "
                    f"{attempt.name!r}, {attempt.result}, nested {len(attempt.nested)}) still "
                    f"running {self.config.drain}s after the stop"
                )
                task.cancel()
        if stranded:
            _dump_stacks()
            await asyncio.wait(stranded)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                self.diagnostics.problems.append(f"task loop failed: {task.exception()!r}")
        probe.cancel()
        await asyncio.wait([probe])
        stats = await self._quiesce()
        ids = {kind: client.id for kind, client in self.all_clients().items()}
        _emit("DRAINED", {"stats": stats, "clients": ids})
        await _expect("close")
        for client in reversed(self.all_clients().values()):  # the RedLock servers first
            await client.aclose()
        del tasks, stranded
        gc.collect()
        await asyncio.sleep(0)
        write_attempts(Path(self.config.out), self.history)
        self.lag.write(Path(self.config.out + ".lag"))
        _emit(
            "DONE",
            {
                "problems": self.diagnostics.problems,
                "logs": dict(self.diagnostics.library_logs),
                "lag": self.lag.summary(),
            },
        )

    async def _quiesce(self) -> dict[str, Any]:
        """Wait until the clients hold, wait for and subscribe to nothing (or report it)."""
        deadline = time.monotonic() + 10.0
        while True:
            clients = self.all_clients()
            stats = {kind: client.statistics() for kind, client in clients.items()}
            busy = {
                kind: asdict(s)
                for kind, s in stats.items()
                if s.holds or s.waiters or s.subscriptions or s.pending
            }
            if not busy:
                return {kind: asdict(s) for kind, s in stats.items()}
            if time.monotonic() > deadline:
                held = {
                    kind: [
                        f"{hold.kind} {hold.name!r} owner {hold.owner.partition(':')[2]} token "
                        f"{hold.token} x{hold.count}{' watchdog' if hold.watchdog else ''}"
                        for hold in services_of(client).holds
                    ]
                    for kind, client in clients.items()
                    if kind in busy
                }
                self.diagnostics.problems.append(
                    f"clients still busy after the drain: {busy}, holding {held}"
                )
                return busy
            await asyncio.sleep(0.05)


def _dump_stacks() -> None:
    """Every task's stack on stderr (kept with ``--keep``): where stranded operations wait."""
    for task in asyncio.all_tasks():
        if task is asyncio.current_task():
            continue
        # Task.print_stack shows one frame of a suspended coroutine: follow its awaits.
        lines = [f"task {task.get_name()}:"]
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                conn = frame.f_locals.get("conn")
                where = "" if conn is None else f" [port {getattr(conn, 'port', '?')}]"
                lines.append(
                    f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}{where}"
                )
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        print("\n".join(lines), file=sys.stderr)
    sys.stderr.flush()


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
