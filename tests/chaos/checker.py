"""The history checker: pure functions from a recorded run to its violations and summary.

What must hold, per phase (see :class:`~tests.chaos.history.Phase`).  The resource is the pair
(kind, name): ``lock("x")``, ``fair_lock("x")`` and ``spin_lock("x")`` are three locks; the read
and the write mode of ``rw_lock("x")`` are one resource, ("rw", "x"); ``semaphore("x")`` is one
more.

For a read-write lock, *exclusion* means: no two write holds overlap, and no read hold overlaps
a write hold of another owner (the writer's own reads, a downgrade, may); *fencing* as below for
write holds, and, for every fresh grant of either mode, a larger token than every fresh grant of
the name that came back before its call began (readers overlap, so "came back before its reply"
is not enough for them); a read inside a write block is a fresh read hold (its own token), a
write asked for inside a read block is refused.  For a semaphore, *exclusion* means no more than
``permits`` holds at once; permits have no tokens.

A composite's parts are holds of the single locks they were taken on (see
:data:`~tests.chaos.history.MULTI` and :data:`~tests.chaos.history.REDLOCK`), checked with every
other hold of those locks: a ``MultiLock``'s part of ``lock("x")`` excludes the plain holds of
"x" and the parts of other MultiLocks on it, with the fencing and timely-loss rules below.  A
part's loss is its own (the other parts of a MultiLock that lost one were still held until
released).  A ``RedLock``'s holds that kept their majority exclude each other (and were told of
a lost majority in time); its token is the largest of its parts' (*composite*), and a grant
holds a majority (all parts of a MultiLock).  Tokens are only compared per part: the largest of
independent counters does not grow from one RedLock grant to the next.

- *exclusion*: no two holds of one resource that did not end lost overlap in time;
- *timely loss*: a hold that lost its lock knew it (``guard.lost``) by the end of its body if
  another hold got the lock before then: the other grant came after the lease ran out on the
  server, and the client's own expiry estimate is a lower bound of that ("late-loop" rather
  than "late-loss" when the holder's event loop was blocked for the whole overlap: its lease
  timer could not fire, the machine's share, shown but not counted);
- *fencing*: a hold that did not end lost has a larger token than every grant of its resource
  that came back before it;
- *fresh tokens*: a token is handed out once per resource as a fresh grant (an outer
  acquisition, or a nested one that made a new hold after the outer one was lost);
  reentrant grants repeat their hold's token, and are not fresh;
- *reentry*: an outer grant is fresh (hold count 1); a nested acquisition by a holder
  re-enters (count 2+) with the token of the hold it re-entered, or, only once the outer hold
  was lost, is a fresh grant (count 1), then checked as a hold of its own;
- *waiting*: every attempt finished, and a bounded wait (``wait > 0``) ended within
  ``wait + slack``, nested ones too ("wait-loop" rather than "wait" when the worker's event
  loop was blocked long enough meanwhile to explain the excess: the machine, not the library);
- *amnesia*: a hold that lived through a restart which lost the server's state was not reported
  as a success (exclusion and fencing are only checked between such restarts);
- *explained losses* (when the run gives ``watchdog_timeout``): a hold reported lost had a
  cause: a fault from a lease before its grant to a second after its body ended, a fixed lease
  its call outlived, or its event loop blocked meanwhile ("loss-loop": the machine's share,
  shown but not counted); else it is a "spurious-loss", a loss report nothing explains;
- *no lingering keys* (when the run sampled the lock keys, ``phase.keys``): a lock's key seen on
  the server while no attempt of its resource was under way (from its call to its end, its
  release or its cancellation, plus ``key_grace`` for a release or a settlement in flight), and
  no fault ran then or within ``fault_grace`` before: a "lingering-key", a grant nobody knows
  that blocks the name until its lease runs out;
- *diagnostics*: whatever the workers and the orchestrator found (warnings, leftover keys...).

Why "came back before it" is enough for fencing: if B never lost its lock, B held it without a
gap from the server's grant to its release, so any grant whose reply arrived before B's reply
was made before B's grant, and so drew a smaller token.  The same argument makes the overlap
check exact: a hold that did not end lost covers its whole critical section on the server.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .history import (
    CANCELLED,
    FAIR,
    GRANTED,
    KINDS,
    LOCK,
    LOST,
    MULTI,
    OK,
    PENDING,
    PERMITS,
    READ,
    REDLOCK,
    REDLOCK_SERVERS,
    RW,
    SEMAPHORE,
    SPIN,
    TIMEOUT,
    WRITE,
    Attempt,
    FaultEvent,
    KeySample,
    Phase,
    Reentry,
)

__all__ = ["Summary", "Violation", "check_phase", "format_summary", "summarize"]

NS = 1_000_000_000


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.detail}"


def check_phase(
    phase: Phase,
    *,
    wait_slack: float = 0.5,
    permits: int = PERMITS,
    watchdog_timeout: float | None = None,
    key_grace: float = 0.25,
    fault_grace: float = 1.0,
) -> list[Violation]:
    """Every violation found in ``phase``; empty when the run was correct.

    A wait overrun says how long its process's event loop was blocked meanwhile (``phase.lag``).
    ``watchdog_timeout``: the workers' option; given, every loss needs a cause (see above).
    """
    origin = min((a.t_start for a in phase.attempts), default=0)
    lag = Lag(phase.lag, phase.gc) if phase.lag or phase.gc else None
    parts = composite_parts(phase.attempts)
    violations = [
        *_check_finished(phase.attempts),
        *_check_waits(phase.attempts, wait_slack, lag),
        *_check_reentries([*phase.attempts, *parts]),
        *_check_composites(phase.attempts),
    ]
    singles = [attempt for attempt in phase.attempts if attempt.kind != MULTI]
    epochs, straddlers = _split_epochs([*holds_of(singles), *parts], phase.amnesia)
    for epoch in epochs:
        for (kind, _), holds in _by_resource(epoch).items():
            if kind == REDLOCK:  # its tokens are checked per part
                violations += _check_exclusion(holds, origin)
                violations += _check_late_losses(holds, origin, lag)
            elif kind == SEMAPHORE:
                violations += _check_permits(holds, origin, permits)
                violations += _check_late_permit_losses(holds, origin, permits, lag)
            elif kind == RW:
                violations += _check_rw_exclusion(holds, origin)
                violations += _check_late_losses(holds, origin, lag, _rw_conflict)
                violations += _check_fresh_tokens(holds)
                violations += _check_fencing(holds, lambda hold: hold.kind == WRITE)
                violations += _check_token_order(holds)
            else:
                violations += _check_exclusion(holds, origin)
                violations += _check_late_losses(holds, origin, lag)
                violations += _check_fresh_tokens(holds)
                violations += _check_fencing(holds)
    if watchdog_timeout is not None:
        losses = [*holds_of(singles), *parts]
        violations += _check_explained_losses(losses, phase.faults, lag, watchdog_timeout)
    violations += _check_amnesia(straddlers, phase.amnesia)
    violations += _check_lingering_keys(
        phase.attempts, phase.keys, phase.faults, (key_grace, fault_grace), origin
    )
    violations += [Violation("diagnostic", problem) for problem in phase.problems]
    return violations


class Lag:
    """Event-loop lag samples per process: ``{proc: [(t_ns, lag_ns), ...]}`` sorted by time,
    and the collector's pauses: ``{proc: [(start_ns, end_ns), ...]}``.

    A sample at ``t`` with lag ``l`` means the loop could run nothing from ``t - l`` to ``t``;
    so does a collector pause, from its start to its end (the two overlap: a pause shows in the
    next sample's lag too, and is counted once).
    """

    def __init__(
        self,
        samples: dict[int, list[tuple[int, int]]],
        gc: dict[int, list[tuple[int, int]]] | None = None,
    ) -> None:
        self._times = {proc: [t for t, _ in rows] for proc, rows in samples.items()}
        self._lags = {proc: [lag for _, lag in rows] for proc, rows in samples.items()}
        self._gc = {proc: sorted(spans) for proc, spans in (gc or {}).items()}

    def _stalls(self, proc: int, start: int, end: int) -> list[tuple[int, int]]:
        """The lag samples' blocked intervals that touch ``start``..``end``."""
        times = self._times.get(proc)
        if not times:
            return []
        lo = bisect.bisect_right(times, start)
        hi = bisect.bisect_right(times, end) + 1  # the next sample covers the last moments
        return [(t - lag, t) for t, lag in zip(times[lo:hi], self._lags[proc][lo:hi], strict=True)]

    def pauses(self, proc: int, start: int, end: int) -> list[tuple[int, int]]:
        """The collector pauses of ``proc`` that touch ``start``..``end``."""
        return [(a, b) for a, b in self._gc.get(proc, ()) if b > start and a < end]

    def blocked(self, proc: int, start: int, end: int) -> float:
        """Seconds during which process ``proc``'s loop was blocked from ``start`` to ``end``."""
        spans = sorted(
            (max(a, start), min(b, end))
            for a, b in [*self._stalls(proc, start, end), *self.pauses(proc, start, end)]
            if min(b, end) > max(a, start)
        )
        total, reached = 0, start
        for a, b in spans:  # their union
            if b > reached:
                total += b - max(a, reached)
                reached = b
        return total / NS

    def collected(self, proc: int, start: int, end: int) -> tuple[float, float]:
        """Seconds the collector paused ``proc`` from ``start`` to ``end``, and its longest
        pause among them."""
        spans = [(max(a, start), min(b, end)) for a, b in self.pauses(proc, start, end)]
        return sum(b - a for a, b in spans) / NS, max((b - a for a, b in spans), default=0) / NS


# A loop blocked this long during a hold (with a second after it, for the release) explains a
# loss: a renewal or a release that long late is the machine's share.
_LOSS_LAG = 0.1


def _check_explained_losses(
    holds: Iterable[Attempt],
    faults: Sequence[FaultEvent],
    lag: Lag | None,
    watchdog_timeout: float,
) -> list[Violation]:
    """Holds reported lost with no cause: no fault from a lease before the grant to a second
    after the body (the release), no fixed lease the call outlived, no blocked event loop."""
    found = []
    for hold in holds:
        if not hold.lost or hold.t_grant is None or hold.t_end is None:
            continue
        if hold.lease is not None and hold.t_end - hold.t_start >= (hold.lease - 0.1) * NS:
            continue  # the body (or a slow grant) may have outlived the lease
        lease = watchdog_timeout if hold.lease is None else hold.lease
        begin = hold.t_grant - round((lease + 1.0) * NS)
        end = hold.t_end + NS
        if any(fault.t_end >= begin and fault.t_start <= end for fault in faults):
            continue
        blocked = 0.0 if lag is None else lag.blocked(hold.proc, hold.t_grant, end)
        paused = 0.0 if lag is None else lag.collected(hold.proc, hold.t_grant, end)[0]
        kind = "loss-loop" if blocked >= _LOSS_LAG else "spurious-loss"
        found.append(
            Violation(
                kind,
                f"{hold.label} {hold.client} {hold.kind} {hold.mode} on {hold.name!r} "
                f"(token {hold.token}, lease {hold.lease}) was reported lost with no fault "
                f"from {lease + 1.0:.1f}s before its grant to 1s after its body "
                f"({_seconds(hold.t_end - hold.t_grant):.3f}s); the loop was blocked "
                f"{blocked:.3f}s meanwhile (the collector {paused:.3f}s): "
                f"{hold.lost_reason or 'no reason recorded'}",
            )
        )
    return found


def _fresh_nested(attempt: Attempt, index: int, entry: Reentry) -> Attempt:
    """A nested grant that was fresh (the outer hold was lost), as a hold of its own."""
    return Attempt(
        proc=attempt.proc,
        task=attempt.task,
        seq=attempt.seq,
        client=attempt.client,
        name=attempt.name,
        mode=f"nested-{entry.call}.{index}",
        wait=entry.wait,
        lease=attempt.lease,
        t_start=entry.t_start,
        t_done=entry.t_done,
        result=entry.result,
        token=entry.token,
        t_grant=entry.t_grant,
        t_end=entry.t_end,
        outcome=entry.outcome,
        lost=entry.lost,
        lost_in_body=entry.lost_in_body,
        kind=entry.kind or attempt.kind,
        count=entry.count,
        owner=attempt.owner,
    )


def _crosses(attempt: Attempt, entry: Reentry) -> bool:
    """A nested grant of the other mode of a read-write lock (a read inside a write block)."""
    return entry.kind is not None and entry.kind != attempt.kind


def _is_fresh(attempt: Attempt, entry: Reentry) -> bool:
    """A nested grant that made a new hold (count 1) rather than re-entering one; without a
    recorded count, one whose token is not its holder's."""
    if not entry.granted:
        return False
    if entry.count is not None:
        return entry.count == 1
    return entry.token is not None and entry.token != attempt.token


def holds_of(attempts: Iterable[Attempt]) -> list[Attempt]:
    """Every fresh grant: the attempts, plus the nested grants that made a new hold (after the
    outer one was lost; :func:`_check_reentries` checks that they only came then)."""
    holds = []
    for attempt in attempts:
        holds.append(attempt)
        for index, entry in enumerate(attempt.nested):
            if attempt.granted and _is_fresh(attempt, entry):
                holds.append(_fresh_nested(attempt, index, entry))
    return holds


def composite_parts(attempts: Iterable[Attempt]) -> list[Attempt]:
    """The parts of the composites' grants, each as a hold of the single lock it was taken on,
    from the part's own grant (a MultiLock's first part may be taken long before its last) to
    the composite's body's end: the part's token, count and losses, the composite's outcome."""
    found = []
    for attempt in attempts:
        if attempt.kind not in (MULTI, REDLOCK) or not attempt.granted:
            continue
        for index, part in enumerate(attempt.parts):
            outcome = attempt.outcome
            if outcome == LOST:  # the composite lost some part; this one if its flag says so
                outcome = LOST if part.lost else OK
            found.append(
                dataclasses.replace(
                    attempt,
                    kind=part.kind,
                    name=part.name,
                    client=part.client,
                    mode=f"{attempt.kind}-{attempt.mode}.{index}",
                    t_grant=attempt.t_grant if part.t_grant is None else part.t_grant,
                    token=part.token,
                    count=part.count,
                    lost=part.lost,
                    lost_in_body=part.lost_in_body,
                    outcome=outcome,
                    nested=[],
                    parts=[],
                )
            )
    return found


def _check_composites(attempts: Iterable[Attempt]) -> list[Violation]:
    """A composite's grant holds every part (MultiLock) or a majority (RedLock), and a
    RedLock's token is the largest of its parts'."""
    found = []
    for attempt in attempts:
        if attempt.kind not in (MULTI, REDLOCK) or not attempt.granted:
            continue
        needed = 2 if attempt.kind == MULTI else REDLOCK_SERVERS // 2 + 1
        tokens = [part.token for part in attempt.parts]
        if len(tokens) < needed:
            found.append(
                Violation(
                    "composite",
                    f"{attempt.label} {attempt.kind} {attempt.name!r} was granted with "
                    f"{len(tokens)} part(s), fewer than {needed}",
                )
            )
        elif attempt.kind == REDLOCK and attempt.token != max(tokens):
            found.append(
                Violation(
                    "composite",
                    f"{attempt.label} redlock {attempt.name!r} got token {attempt.token}, not "
                    f"the largest of its parts' {tokens}",
                )
            )
    return found


def _ended_lost(attempt: Attempt) -> bool:
    return attempt.lost or attempt.outcome == LOST


def _seconds(ns: int) -> float:
    return ns / NS


def _describe(attempt: Attempt, origin: int) -> str:
    assert attempt.t_grant is not None
    end = "?" if attempt.t_end is None else f"{_seconds(attempt.t_end - origin):.3f}"
    owner = f", owner {attempt.owner}" if attempt.kind in (READ, WRITE, SEMAPHORE) else ""
    return (
        f"{attempt.label} ({attempt.client}, {attempt.kind} {attempt.mode}, lease={attempt.lease}, "
        f"token={attempt.token}, held {_seconds(attempt.t_grant - origin):.3f}-{end}s, "
        f"ended {attempt.outcome}{owner})"
    )


def _check_finished(attempts: Iterable[Attempt]) -> list[Violation]:
    found = []
    for attempt in attempts:
        if attempt.result == PENDING:
            found.append(Violation("stranded", f"{attempt.label} never finished waiting"))
        elif attempt.granted and attempt.outcome is None:
            found.append(Violation("stranded", f"{attempt.label} never released {attempt.name!r}"))
        for index, entry in enumerate(attempt.nested):
            where = f"{attempt.label} nested {entry.call} #{index}"
            if entry.result == PENDING:
                found.append(Violation("stranded", f"{where} never finished waiting"))
            elif entry.granted and entry.outcome is None:
                found.append(Violation("stranded", f"{where} never released {attempt.name!r}"))
    return found


def _check_waits(
    attempts: Iterable[Attempt], slack: float, lag: Lag | None = None
) -> list[Violation]:
    """Bounded waits that overran ``wait + slack``: "wait-loop" when the process's event loop
    was blocked at least the excess meanwhile (a deadline cannot fire while the loop is
    blocked: the machine's share), else "wait" (the library's)."""
    found = []
    for attempt in attempts:
        calls: list[tuple[str, Attempt | Reentry]] = [(attempt.mode, attempt)]
        calls += [(f"nested {entry.call}", entry) for entry in attempt.nested]
        for mode, call in calls:
            # wait=0 is documented as one attempt "however long that call takes" (LockKind's
            # try_until): only a real wait promises a deadline.
            if not call.wait or call.t_done is None:
                continue
            if call.result not in (GRANTED, TIMEOUT):
                continue
            waited = _seconds(call.t_done - call.t_start)
            if waited <= call.wait + slack:
                continue
            kind, detail = "wait", ""
            if isinstance(call, Attempt) and call.t_call is not None:
                detail += f", the call began {_seconds(call.t_call - call.t_start):.3f}s in"
            if lag is not None:
                blocked = lag.blocked(attempt.proc, call.t_start, call.t_done)
                detail += f", the loop was blocked {blocked:.3f}s meanwhile"
                if waited - blocked <= call.wait + slack:
                    kind = "wait-loop"
            found.append(
                Violation(
                    kind,
                    f"{attempt.label} {attempt.client} {attempt.kind} {mode}(wait={call.wait}) "
                    f"on {attempt.name!r} ended {call.result} after {waited:.3f}s{detail}",
                )
            )
    return found


def _check_reentries(attempts: Iterable[Attempt]) -> list[Violation]:
    """Grant counts and tokens: an outer grant is fresh (count 1: its owner is new); a nested
    grant either re-enters (count 2+) and carries the token of the hold it re-entered (the
    outer one, or a fresh nested one made after the outer was lost), or is fresh (count 1),
    which it may only be once the outer hold was lost."""
    found = []
    for attempt in attempts:
        if attempt.granted and attempt.count is not None and attempt.count != 1:
            found.append(
                Violation(
                    "reentry",
                    f"{attempt.label} ({attempt.kind} {attempt.name!r}) was granted with hold "
                    f"count {attempt.count}: its new owner had holds it did not know of",
                )
            )
        # The token of the hold a reentry now re-enters, per mode (a read-write lock's reentries
        # take either mode; the other mode's first one is a fresh hold of its own).
        current: dict[str | None, int | None] = {None: attempt.token}
        for index, entry in enumerate(attempt.nested):
            mode = entry.kind if _crosses(attempt, entry) else None
            if not entry.granted:
                continue
            where = (
                f"{attempt.label} ({attempt.kind} {attempt.name!r}) nested {entry.call} #{index}"
            )
            if entry.token is None:
                found.append(Violation("reentry", f"{where} was granted without a token"))
            elif not attempt.granted:
                found.append(Violation("reentry", f"{where} was granted outside a hold"))
            elif _is_fresh(attempt, entry):
                if mode is None and not _ended_lost(attempt):
                    found.append(
                        Violation(
                            "reentry",
                            f"{where} got a fresh grant (token {entry.token}, count "
                            f"{entry.count}) although the outer hold ({attempt.token}) was "
                            "never lost",
                        )
                    )
                current[mode] = entry.token
            elif entry.token != current.get(mode):
                found.append(
                    Violation(
                        "reentry",
                        f"{where} re-entered (count {entry.count}) with token {entry.token}, "
                        f"not the held one's {current.get(mode)}",
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


def _by_resource(holds: Iterable[Attempt]) -> dict[tuple[str, str], list[Attempt]]:
    grouped: defaultdict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for hold in holds:
        grouped[hold.resource].append(hold)
    for group in grouped.values():
        group.sort(key=lambda hold: hold.t_grant or 0)
    return grouped


def _check_exclusion(holds: Sequence[Attempt], origin: int) -> list[Violation]:
    """``holds``: one resource, sorted by grant time."""
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
                    f"{hold.kind} {hold.name!r}: {_describe(latest, origin)} overlaps "
                    f"{_describe(hold, origin)}",
                )
            )
        if latest is None or (latest.t_end or 0) < hold.t_end:
            latest = hold
    return found


def _rw_conflict(a: Attempt, b: Attempt) -> bool:
    """Two holds of one read-write lock that may not overlap: two writes, or a read and a
    write of different owners (a writer may read: a nested read, a downgrade)."""
    if WRITE not in (a.kind, b.kind):
        return False
    return a.kind == b.kind or a.owner is None or a.owner != b.owner


def _check_rw_exclusion(holds: Sequence[Attempt], origin: int) -> list[Violation]:
    """``holds``: one read-write lock, sorted by grant time."""
    kept = [hold for hold in holds if not _ended_lost(hold)]
    found = []
    for index, first in enumerate(kept):
        assert first.t_end is not None
        for later in kept[index + 1 :]:
            assert later.t_grant is not None
            if later.t_grant >= first.t_end:
                break
            if _rw_conflict(first, later):
                found.append(
                    Violation(
                        "exclusion",
                        f"rw {first.name!r}: {_describe(first, origin)} overlaps "
                        f"{_describe(later, origin)}",
                    )
                )
    return found


def _check_permits(holds: Sequence[Attempt], origin: int, permits: int) -> list[Violation]:
    """``holds``: one semaphore, sorted by grant time; no more than ``permits`` kept holds at
    any moment (a hold that did not end lost covers its whole window on the server)."""
    found = []
    active: list[Attempt] = []
    for hold in holds:
        if _ended_lost(hold):
            continue
        assert hold.t_grant is not None
        active = [other for other in active if (other.t_end or 0) > hold.t_grant]
        active.append(hold)
        if len(active) > permits:
            found.append(
                Violation(
                    "exclusion",
                    f"semaphore {hold.name!r}: {len(active)} permits held at once (of "
                    f"{permits}): " + "; ".join(_describe(other, origin) for other in active),
                )
            )
    return found


def _late_kind(hold: Attempt, granted: int, lag: Lag | None) -> str:
    """The kind of a late loss: "late-loss", or "late-loop" when ``hold``'s event loop was
    blocked (a stall, a collector pause) for at least as long as the overlap, from just before
    the other grant (``granted``; the lease had run out on the server by then, so the client's
    own, earlier, estimate of its end too) to ``hold``'s end: the client's lease timer could
    not fire meanwhile, and nothing can tell a body whose loop stands still (the machine's
    share, not counted)."""
    assert hold.t_end is not None
    if lag is None:
        return "late-loss"
    start = granted - round(_LOSS_LAG * NS)
    blocked = lag.blocked(hold.proc, start, hold.t_end)
    return "late-loop" if blocked * NS >= hold.t_end - granted else "late-loss"


def _around_lease_end(hold: Attempt, granted: int, lag: Lag | None) -> str:
    """How ``hold``'s loop fared around its lease's end: from just before the other grant
    (``granted``) to ``hold``'s end, how long it was blocked, and how much of it the collector."""
    if lag is None or hold.t_end is None:
        return ""
    start = granted - round(_LOSS_LAG * NS)
    blocked = lag.blocked(hold.proc, start, hold.t_end)
    paused, longest = lag.collected(hold.proc, start, hold.t_end)
    return (
        f" (around its lease's end, {_seconds(hold.t_end - start):.3f}s to its body's end, "
        f"its loop was blocked {blocked:.3f}s, the collector {paused:.3f}s, longest pause "
        f"{longest:.3f}s)"
    )


def _check_late_permit_losses(
    holds: Sequence[Attempt], origin: int, permits: int, lag: Lag | None = None
) -> list[Violation]:
    """``holds``: one semaphore, sorted by grant time.  When a kept permit was granted, the
    kept permits held then and the lost ones whose holders had not yet been told (still in
    their bodies, not knowing it at their end) number at most ``permits``: else some of the
    latter were gone on the server already, and their holders learned it too late."""
    found = []
    for hold in holds:
        if _ended_lost(hold):
            continue
        at = hold.t_grant
        assert at is not None
        live = [
            other
            for other in holds
            if other is not hold
            and (other.t_grant or 0) < at < (other.t_end or 0)
            and (not _ended_lost(other) or not other.lost_in_body)
        ]
        unaware = [other for other in live if _ended_lost(other)]
        if unaware and len(live) + 1 > permits:
            machine = all(_late_kind(other, at, lag) == "late-loop" for other in unaware)
            found.append(
                Violation(
                    "late-loop" if machine else "late-loss",
                    f"semaphore {hold.name!r}: {_describe(hold, origin)} was granted while "
                    f"{len(live)} other permits ran their bodies, of which "
                    f"{'; '.join(_describe(other, origin) for other in unaware)} were lost, "
                    "not yet told of it"
                    + "".join(_around_lease_end(other, at, lag) for other in unaware),
                )
            )
    return found


def _check_late_losses(
    holds: Sequence[Attempt],
    origin: int,
    lag: Lag | None = None,
    conflicts: Callable[[Attempt, Attempt], bool] | None = None,
) -> list[Violation]:
    """``holds``: one resource, sorted by grant time; ``conflicts``: which holds exclude each
    other (all, unless told)."""
    kept = [hold for hold in holds if not _ended_lost(hold)]
    starts = [hold.t_grant or 0 for hold in kept]
    found = []
    for hold in holds:
        if not _ended_lost(hold) or hold.lost_in_body:
            continue
        assert hold.t_grant is not None
        assert hold.t_end is not None
        index = bisect.bisect_right(starts, hold.t_grant)
        while index < len(kept) and starts[index] < hold.t_end:
            if conflicts is None or conflicts(hold, kept[index]):
                found.append(
                    Violation(
                        _late_kind(hold, starts[index], lag),
                        f"{hold.kind} {hold.name!r}: {_describe(kept[index], origin)} was "
                        f"granted while {_describe(hold, origin)} still ran its body, not yet "
                        "told of its loss" + _around_lease_end(hold, starts[index], lag),
                    )
                )
                break
            index += 1
    return found


def _check_fresh_tokens(holds: Sequence[Attempt]) -> list[Violation]:
    """``holds``: the fresh grants of one resource in one epoch; no token twice."""
    found = []
    seen: dict[int, Attempt] = {}
    for hold in holds:
        if hold.token is None:
            continue
        first = seen.setdefault(hold.token, hold)
        if first is not hold:
            found.append(
                Violation(
                    "token-reuse",
                    f"{hold.kind} {hold.name!r}: token {hold.token} handed out fresh to both "
                    f"{first.label} ({first.mode}) and {hold.label} ({hold.mode})",
                )
            )
    return found


def _check_fencing(
    holds: Sequence[Attempt], exclusive: Callable[[Attempt], bool] | None = None
) -> list[Violation]:
    """``holds``: one resource, sorted by grant time (a reused token is another rule's);
    ``exclusive``: the holds the rule is about (all, unless told: a read-write lock's readers
    overlap, so a reply's order says nothing of their grants' order)."""
    found = []
    seen: set[int] = set()
    highest: Attempt | None = None
    for hold in holds:
        token = hold.token
        if token is None:
            found.append(Violation("fencing", f"{hold.label} was granted without a token"))
            continue
        if (
            token not in seen
            and highest is not None
            and not _ended_lost(hold)
            and (exclusive is None or exclusive(hold))
            and (highest.token or 0) >= token
        ):
            found.append(
                Violation(
                    "fencing",
                    f"{hold.kind} {hold.name!r}: {hold.label} got token {token} after "
                    f"{highest.label} had got {highest.token}",
                )
            )
        seen.add(token)
        if highest is None or (highest.token or 0) < token:
            highest = hold
    return found


def _check_token_order(holds: Sequence[Attempt]) -> list[Violation]:
    """``holds``: the fresh grants of one resource, sorted by grant time.  A grant whose reply
    came back before another grant's call began was made first on the server, so drew the
    smaller token (of either mode: one counter per name)."""
    granted = [hold for hold in holds if hold.token is not None and hold.t_grant is not None]
    times = [hold.t_grant or 0 for hold in granted]
    highest: list[Attempt] = []  # highest[i]: the largest token among granted[: i + 1]
    for hold in granted:
        best = highest[-1] if highest else hold
        highest.append(hold if (hold.token or 0) > (best.token or 0) else best)
    found = []
    for hold in granted:
        began = hold.t_call if hold.t_call is not None else hold.t_start
        index = bisect.bisect_left(times, began)
        if index == 0:
            continue
        before = highest[index - 1]
        if (before.token or 0) > (hold.token or 0):
            found.append(
                Violation(
                    "fencing",
                    f"{hold.kind} {hold.name!r}: {hold.label} ({hold.mode}) got token "
                    f"{hold.token} after {before.label} ({before.kind} {before.mode}) had got "
                    f"{before.token} before its call began",
                )
            )
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
                    f"{hold.label} held {hold.kind} {hold.name!r} across a restart that lost all "
                    "locks, "
                    f"and its release reported success",
                )
            )
    return found


def _resources_of(attempt: Attempt) -> set[tuple[str, str]]:
    """The resources whose keys ``attempt`` may have written: its own; a MultiLock's parts
    (any of the kinds its parts are drawn from, for each of its names, when it was not granted:
    it may have held some parts for a while); a RedLock's lock on each of its servers."""
    if attempt.kind == MULTI:
        found = {(kind, name) for kind in (LOCK, FAIR, SPIN) for name in attempt.name.split("+")}
        return found | {(part.kind, part.name) for part in attempt.parts}
    if attempt.kind == REDLOCK:
        return {(LOCK, attempt.name)} | {
            (f"{REDLOCK}{k}", attempt.name) for k in range(1, REDLOCK_SERVERS)
        }
    return {attempt.resource}


def _attempt_span(attempt: Attempt) -> tuple[int, int | None]:
    """From the attempt's call to the last moment its client knew of it (``None``: it never
    finished, so it covers the rest of the run)."""
    if attempt.result == PENDING or (attempt.granted and attempt.outcome is None):
        return attempt.t_start, None
    ends = [attempt.t_done, attempt.t_end]
    for entry in attempt.nested:
        if entry.result == PENDING or (entry.granted and entry.outcome is None):
            return attempt.t_start, None
        ends += [entry.t_done, entry.t_end]
    return attempt.t_start, max(t for t in ends if t is not None)


def _check_lingering_keys(
    attempts: Iterable[Attempt],
    samples: Sequence[KeySample],
    faults: Sequence[FaultEvent],
    graces: tuple[float, float],
    origin: int,
) -> list[Violation]:
    """Lock keys seen with no attempt of their resource under way (from its call to its end,
    plus the first of ``graces``) and no fault then or the second before (for the settlements
    of the calls it cut to land once the connections are back); consecutive sightings of one
    resource (less than a second apart) are one violation."""
    if not samples:
        return []
    margin, after_fault = (round(grace * NS) for grace in graces)
    spans: defaultdict[tuple[str, str], list[tuple[int, int | None]]] = defaultdict(list)
    for attempt in attempts:
        span = _attempt_span(attempt)
        for resource in _resources_of(attempt):
            spans[resource].append(span)

    def known(sample: KeySample) -> bool:
        return any(
            start <= sample.t_end and (end is None or end + margin >= sample.t_start)
            for start, end in spans.get((sample.kind, sample.name), ())
        )

    def faulted(sample: KeySample) -> bool:
        return any(
            fault.t_start <= sample.t_end and fault.t_end + after_fault >= sample.t_start
            for fault in faults
        )

    lingering: defaultdict[tuple[str, str], list[KeySample]] = defaultdict(list)
    for sample in sorted(samples, key=lambda sample: sample.t_start):
        if not known(sample) and not faulted(sample):
            lingering[(sample.kind, sample.name)].append(sample)
    found = []
    for (kind, name), seen in lingering.items():
        stretches: list[list[KeySample]] = []
        for sample in seen:
            if stretches and sample.t_start - stretches[-1][-1].t_end < NS:
                stretches[-1].append(sample)
            else:
                stretches.append([sample])
        for stretch in stretches:
            first, last = stretch[0], stretch[-1]
            ended = [
                end
                for _, end in spans.get((kind, name), ())
                if end is not None and end <= first.t_start
            ]
            before = (
                f"{_seconds(first.t_start - max(ended)):.3f}s after the last attempt of it ended"
                if ended
                else "before any attempt of it"
            )
            found.append(
                Violation(
                    "lingering-key",
                    f"{kind} {name!r}: its key {first.key!r} was on the server with no hold or "
                    f"call of it under way at {_seconds(first.t_start - origin):.3f}s "
                    f"({before}; pttl {first.pttl} ms), seen {len(stretch)} time(s) until "
                    f"{_seconds(last.t_end - origin):.3f}s",
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
    max_waits: dict[str, float]  # kind -> its longest wait (a forever wait's too)
    faults: Counter[str]
    kinds: dict[str, tuple[int, int]]  # kind -> (attempts, grants)
    nested: Counter[str]  # nested acquisitions: calls, reentrant, fresh, timeout, error, ...


def summarize(phases: Iterable[Phase]) -> Summary:
    attempts = [attempt for phase in phases for attempt in phase.attempts]
    faults = Counter(fault.kind for phase in phases for fault in phase.faults)
    errors = Counter(
        text.removeprefix("error:")
        for attempt in attempts
        for text in (attempt.result, attempt.outcome or "")
        if text.startswith("error:")
    )
    waited = [
        (attempt.kind, _seconds(attempt.t_done - attempt.t_start))
        for attempt in attempts
        if attempt.t_done is not None and attempt.result in (GRANTED, TIMEOUT)
    ]
    waits = [wait for _, wait in waited]
    max_waits = {kind: max((w for k, w in waited if k == kind), default=0.0) for kind in KINDS}
    kinds = {
        kind: (
            sum(attempt.kind == kind for attempt in attempts),
            sum(attempt.kind == kind and attempt.granted for attempt in attempts),
        )
        for kind in KINDS
    }
    nested: Counter[str] = Counter()
    for attempt in attempts:
        for entry in attempt.nested:
            nested["calls"] += 1
            if entry.granted:
                nested["fresh" if _is_fresh(attempt, entry) else "reentrant"] += 1
                if entry.holder_lost and not _is_fresh(attempt, entry):
                    nested["reentrant after the holder's loss"] += 1
                if entry.outcome not in (OK, None):
                    nested[f"released {entry.outcome}"] += 1
            else:
                nested[entry.result] += 1
    return Summary(
        attempts=len(attempts),
        grants=sum(attempt.granted for attempt in attempts),
        timeouts=sum(attempt.result == TIMEOUT for attempt in attempts),
        cancelled=sum(CANCELLED in (attempt.result, attempt.outcome) for attempt in attempts),
        errors=errors,
        losses=sum(attempt.granted and _ended_lost(attempt) for attempt in attempts),
        max_wait=max(waits, default=0.0),
        max_waits=max_waits,
        faults=faults,
        kinds=kinds,
        nested=nested,
    )


def format_summary(summary: Summary) -> str:
    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{key} {value}" for key, value in sorted(counter.items())) or "none"

    kinds = ", ".join(
        f"{kind} {tried} attempts/{granted} grants"
        for kind, (tried, granted) in summary.kinds.items()
    )
    return "\n".join(
        [
            f"attempts {summary.attempts}, grants {summary.grants}, "
            f"timeouts {summary.timeouts}, cancelled {summary.cancelled}, "
            f"losses {summary.losses}, max wait {summary.max_wait:.3f}s",
            f"kinds: {kinds}",
            "longest wait by kind: "
            + ", ".join(f"{kind} {wait:.1f}s" for kind, wait in summary.max_waits.items()),
            f"nested acquisitions: {counts(summary.nested)}",
            f"faults: {counts(summary.faults)}",
            f"redis errors seen by callers: {counts(summary.errors)}",
        ]
    )
