"""What a chaos run records: one :class:`Attempt` per lock operation, one :class:`FaultEvent` per
injected fault, serialised as JSON lines so the worker processes and the checker share them.

Times are ``time.monotonic_ns()`` values: ``CLOCK_MONOTONIC`` is system-wide on Linux, so the
times of different processes on one machine compare directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "Attempt",
    "FaultEvent",
    "KeySample",
    "Part",
    "Phase",
    "Reentry",
    "read_attempts",
    "read_gc",
    "read_lag",
    "write_attempts",
    "write_faults",
]

# Attempt.kind: which lock kind, ``client.lock``/``fair_lock``/``spin_lock``, the two modes of
# ``client.rw_lock(name)`` (``.read_lock()``/``.write_lock()``) or ``client.semaphore``.  Kinds
# never share keys, so the resource that exclusion and fencing are about is (kind, name), except
# that a read and a write of one name are one resource, ("rw", name).
LOCK = "lock"
FAIR = "fair"
SPIN = "spin"
READ = "read"
WRITE = "write"
SEMAPHORE = "semaphore"
# The composites.  A ``MultiLock`` over two single locks (``lock``, ``fair`` or ``spin``, each
# of its own name and client) is checked as those locks: each part is a hold of its resource,
# among that kind's other holds.  A ``RedLock`` over three clients (the worker's client and two
# on key prefixes of their own, on the same server) is a resource of its own, ("redlock",
# name), whose holds that kept their majority exclude each other; each part is also a hold of
# the lock it was taken on: the plain lock of the name for the first server (the worker's
# client), ("redlock1", name) and ("redlock2", name) for the others.
MULTI = "multi"
REDLOCK = "redlock"
KINDS = (LOCK, FAIR, SPIN, READ, WRITE, SEMAPHORE, MULTI, REDLOCK)
RW = "rw"  # the resource kind of READ and WRITE
PERMITS = 2  # the chaos run's semaphores: client.semaphore(name, PERMITS)
REDLOCK_SERVERS = 3

# Attempt.result: how the wait ended.
GRANTED = "granted"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
PENDING = "pending"
# Attempt.outcome: how the hold ended ("error:<Type>" for an exception on release).
OK = "ok"
LOST = "lost"


@dataclass
class Reentry:
    """One nested acquisition inside the block of an ``acquire()`` (the mode "nested").

    ``call`` is "acquire" (``async with lock.acquire(wait=...)``) or "try_lock" (``try_lock``
    then ``unlock``).  While the outer hold lasts, the grant is reentrant and its token is the
    outer guard's; once the outer hold was lost (the lease ran out), it may be a fresh grant
    with a new token, which then is a hold of its own.  Times and results as in :class:`Attempt`.
    """

    call: str
    wait: float | None
    t_start: int
    t_done: int | None = None
    result: str = PENDING
    token: int | None = None
    t_grant: int | None = None
    t_end: int | None = None
    outcome: str | None = None
    lost: bool = False
    lost_in_body: bool = False
    holder_lost: bool = False  # the outer guard was already lost when this call returned
    count: int | None = None  # the hold count the grant reported: 1 fresh, 2+ reentrant
    kind: str | None = None  # READ or WRITE inside a read-write hold; None: the outer's kind

    @property
    def granted(self) -> bool:
        return self.result == GRANTED


@dataclass
class Part:
    """One part of a composite's hold (see ``MULTI``/``REDLOCK``): the single lock it is a
    hold of, its grant (token, hold count, time), and whether it was lost by the end of the body and
    by the end of the hold (the part's own flag, after its release)."""

    kind: str  # the resource kind: LOCK, FAIR, SPIN, or "redlock1"/"redlock2"
    name: str
    client: str
    token: int
    count: int
    lost_in_body: bool = False
    lost: bool = False
    t_grant: int | None = None  # when this part was granted (a MultiLock takes them in turn)


@dataclass
class Attempt:
    """One acquisition attempt and, if granted, the hold that followed.

    ``t_grant``..``t_end`` is the critical section as the holder saw it: from the moment the
    acquire call returned to the moment the body ended, before the release was sent.
    """

    proc: int
    task: int
    seq: int
    client: str  # "steady" (no socket timeout), "twitchy" (short socket timeout: resends) or
    # "brittle" (no resends: a lost reply reaches the caller, and the library settles it)
    name: str
    mode: str  # "acquire", "try_lock", "lock" or "nested" (acquire() with reentries inside)
    wait: float | None
    lease: float | None
    t_start: int
    t_done: int | None = None  # when the wait ended
    result: str = PENDING  # granted, timeout, cancelled, pending or "error:<Type>"
    token: int | None = None
    t_grant: int | None = None
    t_end: int | None = None
    outcome: str | None = None  # ok, lost, cancelled or "error:<Type>"; None while held
    lost: bool = False  # guard.lost (or the hold's flag) when the hold ended
    lost_in_body: bool = False  # ... and when the body ended, before the release
    kind: str = LOCK
    count: int | None = None  # the hold count the grant reported: 1, the owner being new
    t_call: int | None = None  # when the operation's task began the call (after scheduling)
    nested: list[Reentry] = field(default_factory=list)  # mode "nested": in the order made
    owner: str | None = None  # the owner id the hold was taken as (READ/WRITE: who may overlap)
    parts: list[Part] = field(default_factory=list)  # MULTI/REDLOCK: the parts granted
    lost_reason: str | None = None  # what the LockLostError (or LockNotOwnedError) said

    @property
    def granted(self) -> bool:
        return self.result == GRANTED

    @property
    def label(self) -> str:
        return f"p{self.proc}/t{self.task}#{self.seq}"

    @property
    def resource(self) -> tuple[str, str]:
        """What exclusion and fencing are about: kinds of one name are different locks, but for
        the read and the write mode of one read-write lock."""
        return (RW if self.kind in (READ, WRITE) else self.kind), self.name


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault as it actually ran (``t_start``..``t_end``)."""

    kind: str
    t_start: int
    t_end: int
    detail: str = ""


@dataclass(frozen=True)
class KeySample:
    """A lock key seen on a server while the run went on: the resource whose key it is (as
    :attr:`Attempt.resource`), and the time of the scan that found it, ``t_start`` (sent) to
    ``t_end`` (its remaining time to live, ``pttl`` ms, read); the key existed in between."""

    kind: str
    name: str
    t_start: int
    t_end: int
    pttl: int
    key: str = ""


@dataclass
class Phase:
    """One server and one set of workers: ``amnesia`` lists the (down, up) windows of restarts
    that lost the server's state; exclusion and fencing are checked between them only."""

    name: str
    attempts: list[Attempt] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    amnesia: list[tuple[int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # diagnostics and cleanup findings
    # Each worker's event-loop lag: proc -> [(monotonic ns, lag ns), ...], in time order.
    lag: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    # Each worker's collector pauses of 1 ms or more: proc -> [(start ns, end ns), ...].
    gc: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    keys: list[KeySample] = field(default_factory=list)  # the lock keys sampled during the run


def attempt_line(attempt: Attempt) -> str:
    """``attempt`` as one line of a history file (what :func:`read_attempts` reads back)."""
    return json.dumps(asdict(attempt))


def write_attempts(path: Path, attempts: Iterable[Attempt | str]) -> None:
    """Write a history: attempts, or their lines already made (:func:`attempt_line`)."""
    with path.open("w", encoding="utf-8") as file:
        for attempt in attempts:
            file.write((attempt if isinstance(attempt, str) else attempt_line(attempt)) + "\n")


def read_attempts(path: Path) -> Iterator[Attempt]:
    with path.open(encoding="utf-8") as file:
        for line in file:
            fields = json.loads(line)
            nested = [Reentry(**entry) for entry in fields.pop("nested", [])]
            parts = [Part(**part) for part in fields.pop("parts", [])]
            yield Attempt(**fields, nested=nested, parts=parts)


def read_lag(path: Path) -> list[tuple[int, int]]:
    """A worker's event-loop lag samples, (time, lag) in ns, as its ``LagProbe`` wrote them."""
    return [(int(row[0]), int(row[1])) for row in json.loads(path.read_text(encoding="utf-8"))]


def read_gc(path: Path) -> list[tuple[int, int]]:
    """A worker's collector pauses, (start, end) in ns; none if it wrote no file."""
    if not path.exists():
        return []
    return [(int(row[0]), int(row[1])) for row in json.loads(path.read_text(encoding="utf-8"))]


def write_faults(path: Path, start: int, faults: Iterable[FaultEvent]) -> None:
    """The faults as they ran, and when the phase's load started (for a kept run's analysis)."""
    rows = [asdict(fault) for fault in faults]
    path.write_text(json.dumps({"start": start, "faults": rows}), encoding="utf-8")
