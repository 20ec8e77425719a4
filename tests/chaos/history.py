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

__all__ = ["Attempt", "FaultEvent", "Phase", "read_attempts", "write_attempts"]

# Attempt.result: how the wait ended.
GRANTED = "granted"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
PENDING = "pending"
# Attempt.outcome: how the hold ended ("error:<Type>" for an exception on release).
OK = "ok"
LOST = "lost"


@dataclass
class Attempt:
    """One acquisition attempt and, if granted, the hold that followed.

    ``t_grant``..``t_end`` is the critical section as the holder saw it: from the moment the
    acquire call returned to the moment the body ended, before the release was sent.
    """

    proc: int
    task: int
    seq: int
    client: str  # "steady" (no socket timeout) or "twitchy" (short socket timeout: resends)
    name: str
    mode: str  # "acquire", "try_lock" or "lock"
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

    @property
    def granted(self) -> bool:
        return self.result == GRANTED

    @property
    def label(self) -> str:
        return f"p{self.proc}/t{self.task}#{self.seq}"


@dataclass(frozen=True)
class FaultEvent:
    """One injected fault as it actually ran (``t_start``..``t_end``)."""

    kind: str
    t_start: int
    t_end: int
    detail: str = ""


@dataclass
class Phase:
    """One server and one set of workers: ``amnesia`` lists the (down, up) windows of restarts
    that lost the server's state; exclusion and fencing are checked between them only."""

    name: str
    attempts: list[Attempt] = field(default_factory=list)
    faults: list[FaultEvent] = field(default_factory=list)
    amnesia: list[tuple[int, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # diagnostics and cleanup findings


def write_attempts(path: Path, attempts: Iterable[Attempt]) -> None:
    with path.open("w", encoding="utf-8") as file:
        for attempt in attempts:
            file.write(json.dumps(asdict(attempt)) + "\n")


def read_attempts(path: Path) -> Iterator[Attempt]:
    with path.open(encoding="utf-8") as file:
        for line in file:
            yield Attempt(**json.loads(line))
