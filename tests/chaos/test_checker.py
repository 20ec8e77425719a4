"""The checker on hand-made histories: each broken one must fail, each sound one must pass."""

from __future__ import annotations

from itertools import count

import pytest

from .checker import Lag, check_phase, format_summary, summarize
from .history import Attempt, FaultEvent, KeySample, Part, Phase, Reentry

S = 1_000_000_000  # one second in ns
_seq = count()


def hold(
    start: float,
    end: float,
    token: int,
    *,
    name: str = "x",
    kind: str = "lock",
    outcome: str = "ok",
    lost: bool = False,
    count: int | None = 1,
) -> Attempt:
    """A granted attempt holding ``kind`` ``name`` from ``start`` to ``end`` seconds."""
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
        kind=kind,
        count=count,
    )


def nested(
    outer: Attempt,
    start: float,
    end: float,
    token: int | None,
    *,
    call: str = "acquire",
    outcome: str = "ok",
    lost: bool = False,
    count: int | None = None,
) -> Attempt:
    """``outer`` becomes a "nested" attempt, with a nested grant from ``start`` to ``end``;
    its hold count is 2 (reentrant) unless told, or 1 if its token is not the outer one's."""
    if count is None:
        count = 2 if token == outer.token else 1
    outer.mode = "nested"
    outer.nested.append(
        Reentry(
            call=call,
            wait=None,
            t_start=round(start * S) - 1,
            t_done=round(start * S),
            result="granted",
            token=token,
            t_grant=round(start * S),
            t_end=round(end * S),
            outcome=outcome,
            lost=lost,
            count=count,
        )
    )
    return outer


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


def late_kinds(lag: dict[int, list[tuple[int, int]]]) -> list[str]:
    """A hold told of its loss only at its end (3 s), another granted at 2.9 s."""
    late = hold(1, 3, 1, outcome="lost")
    phase = Phase("test", attempts=[late, hold(2.9, 4, 2)], lag=lag)
    return [violation.kind for violation in check_phase(phase, wait_slack=0.5)]


def test_a_late_loss_while_the_holders_loop_was_blocked_is_the_machines() -> None:
    # Blocked from 2.7 s to 3 s: no timer of the holder could fire before its body ended.
    assert late_kinds({0: [(3 * S, round(0.3 * S))]}) == ["late-loop"]
    # Blocked for 50 ms of the 100 ms overlap: its lease timer could have told it.
    assert late_kinds({0: [(round(2.95 * S), round(0.05 * S))]}) == ["late-loss"]
    # Another process's loop stood still: not the holder's excuse.
    assert late_kinds({1: [(3 * S, round(0.3 * S))]}) == ["late-loss"]


def test_a_late_loss_while_the_collector_paused_the_holder_is_the_machines() -> None:
    late = hold(1, 3, 1, outcome="lost")
    # The collector paused the holder from 2.8 s to 3 s, over its lease's end: no lag sample
    # saw it (the probe's next one would have, after the hold's end).
    phase = Phase("test", attempts=[late, hold(2.9, 4, 2)], gc={0: [(round(2.8 * S), 3 * S)]})
    [found] = check_phase(phase)
    assert found.kind == "late-loop"
    assert "the collector 0.200s, longest pause 0.200s" in found.detail
    # A pause that ended well before the other grant: the holder could have seen its loss.
    phase.gc = {0: [(round(2.5 * S), round(2.7 * S))]}
    [found] = check_phase(phase)
    assert found.kind == "late-loss"
    assert "blocked 0.000s, the collector 0.000s" in found.detail


def test_a_pause_seen_both_by_the_collector_and_the_lag_probe_counts_once() -> None:
    lag = Lag({0: [(3 * S, round(0.2 * S))]}, {0: [(round(2.85 * S), round(2.95 * S))]})
    assert lag.blocked(0, 2 * S, 4 * S) == pytest.approx(0.2)
    assert lag.collected(0, 2 * S, 4 * S) == pytest.approx((0.1, 0.1))
    assert lag.blocked(0, round(2.9 * S), 4 * S) == pytest.approx(0.1)


def test_a_hold_that_ended_in_a_redis_error_still_counts() -> None:
    assert kinds(hold(1, 3, 1, outcome="error:TimeoutError"), hold(2, 4, 2)) == ["exclusion"]


def test_token_going_backwards_fails() -> None:
    assert kinds(hold(1, 2, 5), hold(3, 4, 4)) == ["fencing"]


def test_duplicate_token_fails() -> None:
    assert kinds(hold(1, 2, 5, lost=True), hold(3, 4, 5)) == ["token-reuse"]


# -- kinds: the resource is (kind, name) ------------------------------------------------------


def test_two_kinds_of_one_name_never_conflict() -> None:
    # Overlapping holds, equal tokens, tokens going backwards: three locks, no conflict.
    history = [
        hold(1, 3, 5, kind="lock"),
        hold(2, 4, 5, kind="fair"),
        hold(2.5, 5, 1, kind="spin"),
        hold(4, 6, 6, kind="fair"),
    ]
    assert kinds(*history) == []


@pytest.mark.parametrize("kind", ["lock", "fair", "spin"])
def test_each_kind_is_still_checked(kind: str) -> None:
    history = [hold(1, 3, 5, kind=kind), hold(2, 4, 5, kind=kind), hold(5, 6, 4, kind=kind)]
    assert kinds(*history, hold(2, 4, 5, kind="other")) == ["exclusion", "token-reuse", "fencing"]


# -- the read-write lock: one resource for both modes -------------------------------------------


def rw(start: float, end: float, token: int, kind: str, owner: str, **options: object) -> Attempt:
    attempt = hold(start, end, token, kind=kind, **options)  # type: ignore[arg-type]
    attempt.owner = owner
    return attempt


def test_readers_of_many_owners_overlap() -> None:
    assert (
        kinds(rw(1, 3, 1, "read", "a"), rw(2, 4, 2, "read", "b"), rw(5, 6, 3, "write", "c")) == []
    )


def test_a_reader_overlapping_another_owners_writer_fails() -> None:
    assert kinds(rw(1, 3, 1, "write", "a"), rw(2, 4, 2, "read", "b")) == ["exclusion"]
    assert kinds(rw(1, 3, 1, "read", "b"), rw(2, 4, 2, "write", "a")) == ["exclusion"]


def test_overlapping_writers_fail_even_of_one_owner() -> None:
    assert kinds(rw(1, 3, 1, "write", "a"), rw(2, 4, 2, "write", "a")) == ["exclusion"]


def test_a_lost_writer_may_overlap_a_reader() -> None:
    writer = rw(1, 3, 1, "write", "a", lost=True)
    writer.lost_in_body = True
    assert kinds(writer, rw(2, 4, 2, "read", "b")) == []


def test_a_downgrade_passes() -> None:
    # The writer reads inside its write block (a fresh read hold, a token of its own), and a
    # separate read hold of the writer outlasts the write hold: its own reads may overlap.
    outer = rw(1, 3, 1, "write", "a")
    nested(outer, 1.5, 2, 2, count=1)
    outer.nested[0].kind = "read"
    assert kinds(outer, rw(2.5, 4, 3, "read", "a"), rw(5, 6, 4, "write", "b")) == []


def test_a_nested_read_is_still_excluded_from_other_writers() -> None:
    outer = rw(1, 3, 1, "write", "a", lost=True)
    outer.lost_in_body = True
    nested(outer, 1.5, 2.5, 2, count=1)
    outer.nested[0].kind = "read"
    assert kinds(outer, rw(2, 4, 3, "write", "b")) == ["exclusion"]


def test_a_refused_upgrade_passes() -> None:
    outer = nested(rw(1, 3, 1, "read", "a"), 1.5, 2, None)
    outer.nested[0].kind, outer.nested[0].result = "write", "refused"
    outer.nested[0].token = outer.nested[0].t_grant = outer.nested[0].t_end = None
    assert kinds(outer) == []


def test_read_tokens_share_the_writers_counter() -> None:
    # Fencing tokens of both modes go up; readers' replies may come back out of order.
    assert kinds(rw(1, 2, 5, "write", "a"), rw(3, 4, 5, "read", "b")) == ["token-reuse"]
    assert kinds(rw(1, 2, 5, "write", "a"), rw(3, 4, 4, "read", "b")) == ["fencing"]
    reader = rw(2, 4, 1, "read", "b")
    reader.t_start = reader.t_call = round(0.5 * S)  # its call began before the other's reply
    assert kinds(rw(1, 3, 2, "read", "a"), reader) == []


# -- the semaphore: at most PERMITS holds at once ----------------------------------------------


def permit(start: float, end: float, **options: object) -> Attempt:
    attempt = hold(start, end, 0, kind="semaphore", **options)  # type: ignore[arg-type]
    attempt.token = attempt.count = None
    return attempt


def test_two_permits_at_once_pass() -> None:
    assert kinds(permit(1, 3), permit(2, 4), permit(3, 5), permit(4.5, 6)) == []


def test_three_permits_at_once_fail() -> None:
    assert kinds(permit(1, 3), permit(2, 4), permit(2.5, 5)) == ["exclusion"]


def test_a_lost_permit_does_not_count() -> None:
    history = [permit(1, 3, lost=True), permit(2, 4), permit(2.5, 5)]
    assert kinds(*history) == ["late-loss"]  # ... but its holder should have known
    history[0].lost_in_body = True
    assert kinds(*history) == []


# -- nested acquisitions and fresh tokens -----------------------------------------------------


def test_a_reentrant_grant_repeats_its_holders_token() -> None:
    outer = nested(hold(1, 3, 7), 1.5, 2, 7)
    nested(outer, 2, 2.5, 7, call="try_lock")
    assert kinds(outer, hold(3, 4, 8)) == []


def test_a_fresh_token_handed_out_twice_fails() -> None:
    # Two outer (fresh) grants of one resource with one token, even a lost one and far apart.
    assert kinds(hold(1, 2, 7, lost=True), hold(10, 11, 7, outcome="lost")) == ["token-reuse"]
    assert kinds(hold(1, 2, 7, kind="fair"), hold(10, 11, 7, kind="fair")) == ["token-reuse"]


def test_a_reentrant_grant_with_another_token_fails() -> None:
    assert kinds(nested(hold(1, 3, 7), 1.5, 2, 9, count=2)) == ["reentry"]


def test_a_fresh_nested_grant_while_the_outer_hold_lasts_fails() -> None:
    # A new hold (count 1) while the outer one was never lost: it overlaps it too.
    assert kinds(nested(hold(1, 3, 7), 1.5, 2, 9)) == ["reentry", "exclusion"]


def test_an_outer_grant_that_re_entered_fails() -> None:
    # A new owner's grant with count 2: the server had a hold of it the owner did not know of.
    assert kinds(hold(1, 2, 7, count=2)) == ["reentry"]


def test_a_reentrant_grant_without_a_token_fails() -> None:
    assert kinds(nested(hold(1, 3, 7), 1.5, 2, None, count=2)) == ["reentry"]


def test_reentering_a_fresh_nested_hold_repeats_its_token() -> None:
    # The outer hold (7) was lost; a nested acquire made a new hold (9, count 1); the next
    # nested call re-entered that one (count 2): 9 twice, but handed out fresh once only.
    outer = nested(hold(1, 3, 7, lost=True, outcome="lost"), 1.5, 2, 9)
    nested(outer, 2.1, 2.2, 9, count=2)
    outer.lost_in_body = True
    assert kinds(outer) == []
    outer.nested[1].count = 1  # both fresh with one token
    assert kinds(outer) == ["token-reuse"]
    outer.nested[1].count, outer.nested[1].token = 2, 7  # re-entered the lost outer hold's
    assert kinds(outer) == ["reentry"]


def test_a_fresh_nested_grant_after_a_loss_is_a_hold_of_its_own() -> None:
    # The outer lease ran out; the nested acquire got the lock afresh, with a new token.
    outer = nested(hold(1, 3, 7, lost=True, outcome="lost"), 2, 2.5, 9)
    outer.lost_in_body = True
    assert kinds(outer, hold(3, 4, 10)) == []
    # ... so it must not overlap another hold, nor reuse a fresh token, nor go backwards.
    assert kinds(outer, hold(2.2, 4, 10)) == ["exclusion"]
    assert kinds(outer, hold(1.5, 1.8, 9, lost=True)) == ["token-reuse"]
    assert kinds(outer, hold(1.5, 1.8, 11)) == ["fencing"]


def test_a_nested_grant_repeating_another_holds_token_fails() -> None:
    # After its outer hold was lost, a nested grant came back with a token handed out before.
    outer = nested(hold(1, 3, 7, lost=True, outcome="lost"), 2, 2.5, 6)
    outer.lost_in_body = True
    assert kinds(hold(0, 0.5, 6), outer) == ["token-reuse"]


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


def test_a_wait_overrun_while_the_loop_was_blocked_is_the_machines() -> None:
    overruns = [waited(1.0, 2.0), waited(1.0, 2.5)]
    # Worker 0's loop was blocked from 0.5 s to 1.2 s: it explains 0.7 s of excess, not 1.0.
    phase = Phase("test", attempts=overruns, lag={0: [(S // 2, 0), (round(1.2 * S), 7 * S // 10)]})
    assert [v.kind for v in check_phase(phase, wait_slack=0.5)] == ["wait-loop", "wait"]


def test_wait_zero_is_one_attempt_however_long() -> None:
    assert kinds(waited(0.0, 3.0), waited(0.0, 3.0, "granted")) == []


def test_redis_errors_are_not_wait_overruns() -> None:
    assert kinds(waited(0.1, 5.0, "error:TimeoutError"), waited(0.1, 5.0, "cancelled")) == []


def test_stranded_waiter_and_holder_fail() -> None:
    holder = hold(1, 2, 1)
    holder.outcome = None
    assert kinds(waited(1.0, 0.5, "pending"), holder) == ["stranded", "stranded"]


def test_stranded_and_late_nested_acquisitions_fail() -> None:
    outer = nested(hold(1, 3, 7), 1.5, 2, 7)
    outer.nested[0].outcome = None
    outer.nested.append(Reentry("try_lock", 0.2, round(2 * S), round(2.8 * S), "timeout"))
    outer.nested.append(Reentry("acquire", 0.2, round(2 * S)))
    assert kinds(outer) == ["stranded", "stranded", "wait"]


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
            nested(hold(2, 3, 2, kind="fair", outcome="lost"), 2.5, 2.6, 2),
            waited(1.0, 1.2),
            waited(1.0, 0.2, "error:TimeoutError"),
        ],
        faults=[FaultEvent("pause", 0, 1), FaultEvent("pause", 2, 3), FaultEvent("freeze", 4, 5)],
    )
    summary = summarize([phase])
    assert (summary.attempts, summary.grants, summary.timeouts, summary.losses) == (4, 2, 1, 1)
    assert summary.max_wait == pytest.approx(1.2)
    assert summary.max_waits["lock"] == pytest.approx(1.2)
    assert summary.max_waits["fair"] == pytest.approx(0.0, abs=1e-6)  # granted at once
    assert dict(summary.faults) == {"pause": 2, "freeze": 1}
    assert dict(summary.errors) == {"TimeoutError": 1}
    assert summary.kinds == {
        "lock": (3, 1),
        "fair": (1, 1),
        "spin": (0, 0),
        "read": (0, 0),
        "write": (0, 0),
        "semaphore": (0, 0),
        "multi": (0, 0),
        "redlock": (0, 0),
    }
    assert dict(summary.nested) == {"calls": 1, "reentrant": 1}
    text = format_summary(summary)
    assert "faults: freeze 1, pause 2" in text
    assert "kinds: lock 3 attempts/1 grants, fair 1 attempts/1 grants" in text
    assert "nested acquisitions: calls 1, reentrant 1" in text


def composite(
    kind: str, start: float, end: float, parts: list[Part], *, outcome: str = "ok"
) -> Attempt:
    """A MultiLock's or RedLock's grant (its name, token and losses as the worker records)."""
    attempt = hold(start, end, 0, kind=kind, outcome=outcome, count=None)
    attempt.parts = parts
    attempt.token = None if kind == "multi" else max(part.token for part in parts)
    attempt.name = "+".join(part.name for part in parts) if kind == "multi" else "x"
    attempt.lost = kind == "multi" and any(part.lost for part in parts)
    return attempt


def test_a_multilock_part_overlapping_a_plain_hold_is_an_exclusion_violation() -> None:
    parts = [Part("lock", "a", "steady", 5, 1), Part("fair", "b", "twitchy", 3, 1)]
    multi = composite("multi", 1.0, 2.0, parts)
    found = check_phase(Phase("p", attempts=[hold(1.5, 2.5, 6, name="a"), multi]))
    assert [v.kind for v in found] == ["exclusion"], found
    assert "'a'" in found[0].detail
    # The same parts one after the other (tokens in order) are sound.
    after = composite(
        "multi", 2.0, 3.0, [Part("lock", "a", "steady", 7, 1), Part("fair", "b", "twitchy", 4, 1)]
    )
    assert check_phase(Phase("p", attempts=[hold(0.0, 0.9, 2, name="a"), multi, after])) == []


def test_a_multilocks_lost_part_is_not_checked_but_its_other_part_is() -> None:
    lost = Part("lock", "a", "steady", 5, 1, lost_in_body=True, lost=True)
    multi = composite("multi", 1.0, 2.0, [lost, Part("spin", "b", "steady", 6, 1)], outcome="lost")
    others = [hold(1.5, 2.5, 7, name="a"), hold(1.5, 2.5, 8, name="b", kind="spin")]
    found = check_phase(Phase("p", attempts=[multi, *others]))
    assert [v.kind for v in found] == ["exclusion"], found
    assert "spin 'b'" in found[0].detail


def test_redlocks_that_kept_their_majority_exclude_each_other() -> None:
    def parts(*tokens: int) -> list[Part]:
        kinds = ["lock", "redlock1", "redlock2"]
        return [Part(kinds[i], "x", "steady", token, 1) for i, token in enumerate(tokens)]

    first = composite("redlock", 1.0, 2.0, parts(3, 9, 4))
    # The largest token of independent counters may go down: only each part's order counts.
    second = composite("redlock", 1.5, 2.5, parts(5, 10, 6))
    found = check_phase(Phase("p", attempts=[first, second]))
    assert sorted(v.kind for v in found) == ["exclusion"] * 4, found  # the whole and 3 parts
    # Two parts after it: token 6 < 9, sound (the parts it shares with the first are later).
    later = composite("redlock", 2.0, 3.0, parts(5, 0, 6)[::2])
    assert check_phase(Phase("p", attempts=[first, later])) == []
    later.token = 5
    found = check_phase(Phase("p", attempts=[first, later]))
    assert [v.kind for v in found] == ["composite"], found
    short = composite("redlock", 3.0, 4.0, [Part("lock", "x", "steady", 8, 1)])
    assert [v.kind for v in check_phase(Phase("p", attempts=[short]))] == ["composite"]


def explained(
    *attempts: Attempt,
    faults: list[FaultEvent] | None = None,
    lag: dict[int, list[tuple[int, int]]] | None = None,
) -> list[str]:
    """The violation kinds with the explained-losses rule on (a 1.5 s watchdog lease)."""
    phase = Phase("test", attempts=list(attempts), faults=faults or [], lag=lag or {})
    return [violation.kind for violation in check_phase(phase, watchdog_timeout=1.5)]


def test_a_loss_with_no_fault_near_it_is_spurious() -> None:
    lost = hold(10, 10.01, 1, outcome="lost", lost=True)
    assert explained(lost) == ["spurious-loss"]
    # A fault 2.6 s before the grant is further back than the lease and a second.
    assert explained(lost, faults=[FaultEvent("restart", 6 * S, round(7.4 * S))]) == [
        "spurious-loss"
    ]
    assert kinds(lost) == []  # the rule is on only where the run gives its lease


def test_a_loss_near_a_fault_is_explained() -> None:
    lost = hold(10, 10.01, 1, outcome="lost", lost=True)
    assert explained(lost, faults=[FaultEvent("restart", 7 * S, round(7.6 * S))]) == []
    assert explained(lost, faults=[FaultEvent("freeze", round(10.5 * S), 11 * S)]) == []


def test_a_fixed_lease_outlived_explains_a_loss() -> None:
    lost = hold(10, 11, 1, outcome="lost", lost=True)
    lost.lease = 0.9
    assert explained(lost) == []
    lost.lease = 2.0
    assert explained(lost) == ["spurious-loss"]


def test_a_loss_while_the_loop_was_blocked_is_the_machines() -> None:
    lost = hold(10, 10.01, 1, outcome="lost", lost=True)
    blocked = {0: [(10 * S, 0), (round(10.3 * S), round(0.25 * S))]}
    assert explained(lost, lag=blocked) == ["loss-loop"]


# -- lingering keys -------------------------------------------------------------------------


def seen(at: float, *, kind: str = "lock", name: str = "x") -> KeySample:
    """A lock key of ``kind`` ``name`` found by a scan at ``at`` seconds (a 2 ms scan)."""
    return KeySample(kind, name, round(at * S), round(at * S) + 2_000_000, 1500, f"k:{name}")


def lingering(
    attempts: list[Attempt], samples: list[KeySample], faults: list[FaultEvent] | None = None
) -> list[str]:
    phase = Phase("test", attempts=attempts, keys=samples, faults=faults or [])
    found = check_phase(phase, key_grace=0.2, fault_grace=0.5)
    return [violation.kind for violation in found if violation.kind == "lingering-key"]


def test_a_key_that_outlives_every_hold_is_flagged() -> None:
    found = check_phase(Phase("test", attempts=[hold(1, 2, 1)], keys=[seen(2.5), seen(2.7)]))
    assert [violation.kind for violation in found] == ["lingering-key"]
    assert "seen 2 time(s)" in found[0].detail
    assert "0.500s after" in found[0].detail


def test_a_key_of_no_attempt_at_all_is_flagged() -> None:
    assert lingering([hold(1, 2, 1, name="y")], [seen(1.5)]) == ["lingering-key"]


def test_sightings_apart_are_separate_stretches() -> None:
    assert lingering([hold(1, 2, 1)], [seen(3), seen(5)]) == ["lingering-key"] * 2


def test_a_key_during_a_hold_or_within_the_grace_after_it_passes() -> None:
    assert lingering([hold(1, 2, 1)], [seen(1.5), seen(2.1)]) == []


def test_a_key_during_a_call_that_was_not_granted_passes() -> None:
    # A cancelled or timed-out call may have been granted on the server: its settlement gives
    # the grant back within the grace.
    for result in ("cancelled", "timeout"):
        assert lingering([waited(1.0, 1.0, result)], [seen(0.5), seen(1.1)]) == []
    assert lingering([waited(1.0, 1.0, "cancelled")], [seen(1.5)]) == ["lingering-key"]


def test_a_key_while_an_attempt_never_finished_passes() -> None:
    stuck = waited(None, 1.0, "pending")
    stuck.t_done = None
    assert lingering([stuck], [seen(9)]) == []


def test_a_key_inside_a_fault_window_or_its_grace_passes() -> None:
    fault = FaultEvent("freeze", round(2.2 * S), round(3 * S))
    assert lingering([hold(1, 2, 1)], [seen(2.5), seen(3.4)], [fault]) == []
    assert lingering([hold(1, 2, 1)], [seen(3.6)], [fault]) == ["lingering-key"]


def test_a_key_of_another_kind_of_the_name_is_flagged() -> None:
    assert lingering([hold(1, 2, 1)], [seen(1.5, kind="fair")]) == ["lingering-key"]


def test_a_multilock_covers_the_keys_of_its_names() -> None:
    multi = hold(1, 2, 1, name="x+y", kind="multi")
    assert lingering([multi], [seen(1.5, kind="spin", name="y")]) == []
    assert lingering([multi], [seen(1.5, kind="spin", name="z")]) == ["lingering-key"]


def test_a_redlock_covers_its_servers_locks() -> None:
    red = hold(1, 2, 1, kind="redlock")
    assert lingering([red], [seen(1.5), seen(1.5, kind="redlock2")]) == []
