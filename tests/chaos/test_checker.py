"""The checker on hand-made histories: each broken one must fail, each sound one must pass."""

from __future__ import annotations

from itertools import count

import pytest

from .checker import check_phase, format_summary, summarize
from .history import Attempt, FaultEvent, Phase

S = 1_000_000_000  # one second in ns
_seq = count()


def hold(
    start: float,
    end: float,
    token: int,
    *,
    name: str = "x",
    outcome: str = "ok",
    lost: bool = False,
) -> Attempt:
    """A granted attempt holding ``name`` from ``start`` to ``end`` seconds."""
    return Attempt(
        proc=0,
        task=0,
        seq=next(_seq),
        client="steady",
        name=name,
        mode="acquire",
        wait=None,
        lease=None,
        t_start=round(start * S) - 1,
        t_done=round(start * S),
        result="granted",
        token=token,
        t_grant=round(start * S),
        t_end=round(end * S),
        outcome=outcome,
        lost=lost,
    )


def waited(wait: float | None, took: float, result: str = "timeout") -> Attempt:
    attempt = Attempt(0, 1, next(_seq), "twitchy", "x", "try_lock", wait, 1.0, 0)
    attempt.t_done, attempt.result = round(took * S), result
    if result == "granted":
        attempt.t_grant, attempt.t_end, attempt.token, attempt.outcome = 0, 1, 99, "ok"
    return attempt


def kinds(*attempts: Attempt, amnesia: list[tuple[int, int]] | None = None) -> list[str]:
    phase = Phase("test", attempts=list(attempts), amnesia=amnesia or [])
    return [violation.kind for violation in check_phase(phase, wait_slack=0.5)]


def test_sequential_holds_pass() -> None:
    assert kinds(hold(1, 2, 1), hold(2, 3, 2), hold(4, 5, 5)) == []


def test_names_are_independent() -> None:
    assert kinds(hold(1, 3, 1, name="a"), hold(2, 4, 1, name="b")) == []


def test_overlap_fails() -> None:
    assert kinds(hold(1, 3, 1), hold(2, 4, 2)) == ["exclusion"]


def test_overlap_with_an_earlier_long_hold_fails() -> None:
    # The second hold ends first; the third still overlaps the first.
    assert kinds(hold(1, 10, 1), hold(2, 2.5, 2, lost=True), hold(5, 6, 3)) == ["exclusion"]


@pytest.mark.parametrize(
    "lost_hold",
    [hold(1, 3, 1, lost=True), hold(1, 3, 1, outcome="lost")],
    ids=["guard.lost", "LockLostError"],
)
def test_overlap_with_a_lost_hold_passes(lost_hold: Attempt) -> None:
    lost_hold.lost_in_body = True
    assert kinds(lost_hold, hold(2, 4, 2)) == []


def test_a_loss_learned_only_at_release_fails() -> None:
    late = hold(1, 3, 1, outcome="lost")
    assert kinds(late, hold(2, 4, 2)) == ["late-loss"]
    late.lost_in_body = True
    assert kinds(late, hold(2, 4, 2)) == []


def test_a_hold_that_ended_in_a_redis_error_still_counts() -> None:
    assert kinds(hold(1, 3, 1, outcome="error:TimeoutError"), hold(2, 4, 2)) == ["exclusion"]


def test_token_going_backwards_fails() -> None:
    assert kinds(hold(1, 2, 5), hold(3, 4, 4)) == ["fencing"]


def test_duplicate_token_fails() -> None:
    assert kinds(hold(1, 2, 5, lost=True), hold(3, 4, 5)) == ["fencing"]


def test_late_reply_of_a_lost_grant_passes() -> None:
    # Its reply came back after a newer grant's: it was lost, so that order says nothing.
    assert kinds(hold(1, 2, 7), hold(1.5, 3, 6, lost=True)) == []


def test_missing_token_fails() -> None:
    attempt = hold(1, 2, 1)
    attempt.token = None
    assert kinds(attempt) == ["fencing"]


def test_wait_within_slack_passes() -> None:
    assert kinds(waited(1.0, 1.4), waited(None, 30.0), waited(0.1, 0.5, "granted")) == []


def test_wait_overrun_fails() -> None:
    assert kinds(waited(1.0, 1.6), waited(0.1, 0.7, "granted")) == ["wait", "wait"]


def test_wait_zero_is_one_attempt_however_long() -> None:
    assert kinds(waited(0.0, 3.0), waited(0.0, 3.0, "granted")) == []


def test_redis_errors_are_not_wait_overruns() -> None:
    assert kinds(waited(0.1, 5.0, "error:TimeoutError"), waited(0.1, 5.0, "cancelled")) == []


def test_stranded_waiter_and_holder_fail() -> None:
    holder = hold(1, 2, 1)
    holder.outcome = None
    assert kinds(waited(1.0, 0.5, "pending"), holder) == ["stranded", "stranded"]


AMNESIA = [(10 * S, 11 * S)]


def test_hold_across_amnesia_reported_ok_fails() -> None:
    assert kinds(hold(9, 12, 3), amnesia=AMNESIA) == ["amnesia"]


@pytest.mark.parametrize("outcome", ["lost", "error:ConnectionError"])
def test_hold_across_amnesia_not_reported_ok_passes(outcome: str) -> None:
    assert kinds(hold(9, 12, 3, outcome=outcome), amnesia=AMNESIA) == []


def test_amnesia_separates_epochs() -> None:
    # Tokens restart after the state was lost; a hold touching the restart is left out.
    history = [hold(1, 2, 7), hold(9, 10.5, 8, outcome="lost"), hold(12, 13, 1), hold(13, 14, 2)]
    assert kinds(*history, amnesia=AMNESIA) == []


def test_exclusion_is_still_checked_within_an_epoch() -> None:
    assert kinds(hold(12, 14, 1), hold(13, 15, 2), amnesia=AMNESIA) == ["exclusion"]


def test_problems_are_violations() -> None:
    phase = Phase("test", problems=["warning: RuntimeWarning: coroutine was never awaited"])
    assert [v.kind for v in check_phase(phase)] == ["diagnostic"]


def test_summary() -> None:
    phase = Phase(
        "test",
        attempts=[
            hold(1, 2, 1),
            hold(2, 3, 2, outcome="lost"),
            waited(1.0, 1.2),
            waited(1.0, 0.2, "error:TimeoutError"),
        ],
        faults=[FaultEvent("pause", 0, 1), FaultEvent("pause", 2, 3), FaultEvent("freeze", 4, 5)],
    )
    summary = summarize([phase])
    assert (summary.attempts, summary.grants, summary.timeouts, summary.losses) == (4, 2, 1, 1)
    assert summary.max_wait == pytest.approx(1.2)
    assert dict(summary.faults) == {"pause": 2, "freeze": 1}
    assert dict(summary.errors) == {"TimeoutError": 1}
    assert "faults: freeze 1, pause 2" in format_summary(summary)
