"""The history checker: pure functions from a recorded run to its violations and summary.

What must hold, per phase (see :class:`~tests.chaos.history.Phase`):

- *exclusion*: no two holds of one name that did not end lost overlap in time;
- *timely loss*: a hold that lost its lock knew it (``guard.lost``) by the end of its body if
  another hold got the lock before then: the other grant came after the lease ran out on the
  server, and the client's own expiry estimate is a lower bound of that;
- *fencing*: tokens are unique per name, and a hold that did not end lost has a larger token
  than every grant of its name that came back before it;
- *waiting*: every attempt finished, and a bounded wait (``wait > 0``) ended within
  ``wait + slack``;
- *amnesia*: a hold that lived through a restart which lost the server's state was not reported
  as a success (exclusion and fencing are only checked between such restarts);
- *diagnostics*: whatever the workers and the orchestrator found (warnings, leftover keys...).

Why "came back before it" is enough for fencing: if B never lost its lock, B held it without a
gap from the server's grant to its release, so any grant whose reply arrived before B's reply
was made before B's grant, and so drew a smaller token.  The same argument makes the overlap
check exact: a hold that did not end lost covers its whole critical section on the server.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .history import CANCELLED, GRANTED, LOST, OK, PENDING, TIMEOUT, Attempt, Phase

__all__ = ["Summary", "Violation", "check_phase", "format_summary", "summarize"]

NS = 1_000_000_000


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.detail}"


def check_phase(phase: Phase, *, wait_slack: float = 0.5) -> list[Violation]:
    """Every violation found in ``phase``; empty when the run was correct."""
    origin = min((a.t_start for a in phase.attempts), default=0)
    violations = [*_check_finished(phase.attempts), *_check_waits(phase.attempts, wait_slack)]
    epochs, straddlers = _split_epochs(phase.attempts, phase.amnesia)
    for epoch in epochs:
        for holds in _by_name(epoch).values():
            violations += _check_exclusion(holds, origin)
            violations += _check_late_losses(holds, origin)
            violations += _check_fencing(holds)
    violations += _check_amnesia(straddlers, phase.amnesia)
    violations += [Violation("diagnostic", problem) for problem in phase.problems]
    return violations


def _ended_lost(attempt: Attempt) -> bool:
    return attempt.lost or attempt.outcome == LOST


def _seconds(ns: int) -> float:
    return ns / NS


def _describe(attempt: Attempt, origin: int) -> str:
    assert attempt.t_grant is not None
    end = "?" if attempt.t_end is None else f"{_seconds(attempt.t_end - origin):.3f}"
    return (
        f"{attempt.label} ({attempt.client}, {attempt.mode}, lease={attempt.lease}, "
        f"token={attempt.token}, held {_seconds(attempt.t_grant - origin):.3f}-{end}s, "
        f"ended {attempt.outcome})"
    )


def _check_finished(attempts: Iterable[Attempt]) -> list[Violation]:
    found = []
    for attempt in attempts:
        if attempt.result == PENDING:
            found.append(Violation("stranded", f"{attempt.label} never finished waiting"))
        elif attempt.granted and attempt.outcome is None:
            found.append(Violation("stranded", f"{attempt.label} never released {attempt.name!r}"))
    return found


def _check_waits(attempts: Iterable[Attempt], slack: float) -> list[Violation]:
    found = []
    for attempt in attempts:
        # wait=0 is documented as one attempt "however long that call takes" (AsyncRLock's
        # _acquire): only a real wait promises a deadline.
        if not attempt.wait or attempt.t_done is None:
            continue
        if attempt.result not in (GRANTED, TIMEOUT):
            continue
        waited = _seconds(attempt.t_done - attempt.t_start)
        if waited > attempt.wait + slack:
            found.append(
                Violation(
                    "wait",
                    f"{attempt.label} {attempt.mode}(wait={attempt.wait}) on {attempt.name!r} "
                    f"ended {attempt.result} after {waited:.3f}s",
                )
            )
    return found


def _split_epochs(
    attempts: Sequence[Attempt], amnesia: Sequence[tuple[int, int]]
) -> tuple[list[list[Attempt]], list[Attempt]]:
    """Holds grouped by the state-losing restarts around them; holds that touch one apart."""
    windows = sorted(amnesia)
    epochs: list[list[Attempt]] = [[] for _ in range(len(windows) + 1)]
    straddlers = []
    for attempt in attempts:
        if not attempt.granted or attempt.t_grant is None or attempt.t_end is None:
            continue
        start, end = attempt.t_grant, attempt.t_end
        if any(start <= up and end >= down for down, up in windows):
            straddlers.append(attempt)
        else:
            epochs[sum(1 for _, up in windows if up < start)].append(attempt)
    return epochs, straddlers


def _by_name(holds: Iterable[Attempt]) -> dict[str, list[Attempt]]:
    grouped: defaultdict[str, list[Attempt]] = defaultdict(list)
    for hold in holds:
        grouped[hold.name].append(hold)
    for group in grouped.values():
        group.sort(key=lambda hold: hold.t_grant or 0)
    return grouped


def _check_exclusion(holds: Sequence[Attempt], origin: int) -> list[Violation]:
    """``holds``: one name, sorted by grant time."""
    found = []
    latest: Attempt | None = None  # the kept hold that ends last so far
    for hold in holds:
        if _ended_lost(hold):
            continue
        assert hold.t_grant is not None
        assert hold.t_end is not None
        if latest is not None and latest.t_end is not None and hold.t_grant < latest.t_end:
            found.append(
                Violation(
                    "exclusion",
                    f"{hold.name!r}: {_describe(latest, origin)} overlaps "
                    f"{_describe(hold, origin)}",
                )
            )
        if latest is None or (latest.t_end or 0) < hold.t_end:
            latest = hold
    return found


def _check_late_losses(holds: Sequence[Attempt], origin: int) -> list[Violation]:
    """``holds``: one name, sorted by grant time."""
    kept = [hold for hold in holds if not _ended_lost(hold)]
    starts = [hold.t_grant or 0 for hold in kept]
    found = []
    for hold in holds:
        if not _ended_lost(hold) or hold.lost_in_body:
            continue
        assert hold.t_grant is not None
        assert hold.t_end is not None
        index = bisect.bisect_right(starts, hold.t_grant)
        if index < len(kept) and starts[index] < hold.t_end:
            found.append(
                Violation(
                    "late-loss",
                    f"{hold.name!r}: {_describe(kept[index], origin)} was granted while "
                    f"{_describe(hold, origin)} still ran its body, not yet told of its loss",
                )
            )
    return found


def _check_fencing(holds: Sequence[Attempt]) -> list[Violation]:
    """``holds``: one name, sorted by grant time."""
    found = []
    seen: dict[int, Attempt] = {}
    highest: Attempt | None = None
    for hold in holds:
        token = hold.token
        if token is None:
            found.append(Violation("fencing", f"{hold.label} was granted without a token"))
            continue
        if token in seen:
            found.append(
                Violation(
                    "fencing",
                    f"{hold.name!r}: token {token} granted to both {seen[token].label} "
                    f"and {hold.label}",
                )
            )
        elif highest is not None and not _ended_lost(hold) and (highest.token or 0) >= token:
            found.append(
                Violation(
                    "fencing",
                    f"{hold.name!r}: {hold.label} got token {token} after {highest.label} "
                    f"had got {highest.token}",
                )
            )
        seen[token] = hold
        if highest is None or (highest.token or 0) < token:
            highest = hold
    return found


def _check_amnesia(
    straddlers: Iterable[Attempt], amnesia: Sequence[tuple[int, int]]
) -> list[Violation]:
    """A hold granted before a state-losing restart and ended after it cannot be a success."""
    found = []
    for hold in straddlers:
        assert hold.t_grant is not None
        assert hold.t_end is not None
        survived = any(hold.t_grant < down and hold.t_end > up for down, up in amnesia)
        if survived and hold.outcome == OK and not hold.lost:
            found.append(
                Violation(
                    "amnesia",
                    f"{hold.label} held {hold.name!r} across a restart that lost all locks, "
                    f"and its release reported success",
                )
            )
    return found


@dataclass(frozen=True)
class Summary:
    attempts: int
    grants: int
    timeouts: int
    cancelled: int
    errors: Counter[str]
    losses: int
    max_wait: float
    faults: Counter[str]


def summarize(phases: Iterable[Phase]) -> Summary:
    attempts = [attempt for phase in phases for attempt in phase.attempts]
    faults = Counter(fault.kind for phase in phases for fault in phase.faults)
    errors = Counter(
        text.removeprefix("error:")
        for attempt in attempts
        for text in (attempt.result, attempt.outcome or "")
        if text.startswith("error:")
    )
    waits = [
        _seconds(attempt.t_done - attempt.t_start)
        for attempt in attempts
        if attempt.t_done is not None and attempt.result in (GRANTED, TIMEOUT)
    ]
    return Summary(
        attempts=len(attempts),
        grants=sum(attempt.granted for attempt in attempts),
        timeouts=sum(attempt.result == TIMEOUT for attempt in attempts),
        cancelled=sum(CANCELLED in (attempt.result, attempt.outcome) for attempt in attempts),
        errors=errors,
        losses=sum(attempt.granted and _ended_lost(attempt) for attempt in attempts),
        max_wait=max(waits, default=0.0),
        faults=faults,
    )


def format_summary(summary: Summary) -> str:
    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{key} {value}" for key, value in sorted(counter.items())) or "none"

    return "\n".join(
        [
            f"attempts {summary.attempts}, grants {summary.grants}, "
            f"timeouts {summary.timeouts}, cancelled {summary.cancelled}, "
            f"losses {summary.losses}, max wait {summary.max_wait:.3f}s",
            f"faults: {counts(summary.faults)}",
            f"redis errors seen by callers: {counts(summary.errors)}",
        ]
    )
