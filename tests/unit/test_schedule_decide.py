"""The schedule decision (schedules/decide.py), a pure value: its docstring's tables, row by row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from schedules.decide import ON_TIME_SECONDS, CatchUp, Decision, Overlap, Policy, Reason, decide

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def minutes_ago(*ago: int) -> list[datetime]:
    return [NOW - timedelta(minutes=m) for m in ago]


def run(due: list[datetime], policy: Policy, *, active: bool = False, buffered: bool = False) -> Decision:
    return decide(due=due, now=NOW, policy=policy, active=active, buffered=buffered, last_slot=NOW - timedelta(hours=1))


DOWNTIME = minutes_ago(5, 4, 3, 2, 1, 0)  # six slots due at once: five missed, one on time


@pytest.mark.parametrize(
    ("policy", "enqueued"),
    [
        (Policy(catch_up=CatchUp.SKIP, overlap=Overlap.ALLOW), minutes_ago(0)),
        (Policy(catch_up=CatchUp.LATEST, overlap=Overlap.ALLOW), minutes_ago(0)),
        (Policy(catch_up=CatchUp.ALL_WITHIN, overlap=Overlap.ALLOW, window_seconds=150, max_count=10), minutes_ago(2, 1, 0)),
        (Policy(catch_up=CatchUp.ALL_WITHIN, overlap=Overlap.ALLOW, window_seconds=3600, max_count=4), minutes_ago(3, 2, 1, 0)),
    ],
)
def test_catch_up_after_downtime_runs_the_policy_slots_and_records_the_rest(policy: Policy, enqueued: list[datetime]) -> None:
    decision = run(DOWNTIME, policy)
    assert list(decision.enqueue) == enqueued
    assert [slot for slot, _ in decision.skipped] == [slot for slot in DOWNTIME if slot not in enqueued]
    assert {reason for _, reason in decision.skipped} == {Reason.CATCH_UP}
    assert decision.last_slot == NOW


def test_skip_runs_nothing_when_the_newest_slot_is_late_and_latest_runs_it_once() -> None:
    late = [NOW - timedelta(seconds=ON_TIME_SECONDS + 1)]
    assert run(late, Policy(catch_up=CatchUp.SKIP)).enqueue == ()
    assert run(late, Policy(catch_up=CatchUp.SKIP)).skipped == ((late[0], Reason.CATCH_UP),)
    assert run(late, Policy(catch_up=CatchUp.LATEST)).enqueue == tuple(late)


def test_overlap_skip_runs_nothing_while_a_run_is_live() -> None:
    decision = run(minutes_ago(0), Policy(overlap=Overlap.SKIP), active=True)
    assert decision.enqueue == () and decision.skipped == ((NOW, Reason.OVERLAP),)
    assert run(minutes_ago(0), Policy(overlap=Overlap.SKIP)).enqueue == (NOW,)


def test_overlap_skip_runs_one_of_several_catch_up_slots() -> None:
    policy = Policy(catch_up=CatchUp.ALL_WITHIN, overlap=Overlap.SKIP, window_seconds=3600, max_count=10)
    decision = run(minutes_ago(2, 1, 0), policy)
    assert decision.enqueue == tuple(minutes_ago(2))
    assert decision.skipped == tuple((slot, Reason.OVERLAP) for slot in minutes_ago(1, 0))


@pytest.mark.parametrize(
    ("active", "buffered", "enqueue", "buffer", "promote", "overlapped"),
    [
        (False, False, minutes_ago(2), minutes_ago(1)[0], False, minutes_ago(0)),
        (True, False, [], minutes_ago(2)[0], False, minutes_ago(1, 0)),
        (True, True, [], None, False, minutes_ago(2, 1, 0)),
        (False, True, [], minutes_ago(2)[0], True, minutes_ago(1, 0)),
    ],
)
def test_buffer_one_keeps_at_most_one_waiting(
    active: bool, buffered: bool, enqueue: list[datetime], buffer: datetime | None, promote: bool, overlapped: list[datetime]
) -> None:
    policy = Policy(catch_up=CatchUp.ALL_WITHIN, overlap=Overlap.BUFFER_ONE, window_seconds=3600, max_count=10)
    decision = run(minutes_ago(2, 1, 0), policy, active=active, buffered=buffered)
    assert list(decision.enqueue) == enqueue
    assert decision.buffer == buffer
    assert decision.promote_buffered is promote
    assert decision.skipped == tuple((slot, Reason.OVERLAP) for slot in overlapped)


def test_nothing_due_changes_nothing_and_the_last_slot_never_moves_back() -> None:
    last = NOW + timedelta(hours=2)  # the clock jumped back two hours
    decision = decide(due=[], now=NOW, policy=Policy(), active=False, buffered=False, last_slot=last)
    assert not decision.changes and decision.last_slot == last


def test_due_slots_must_be_past_and_ascending() -> None:
    with pytest.raises(AssertionError):
        decide(due=[NOW + timedelta(seconds=1)], now=NOW, policy=Policy(), active=False, buffered=False, last_slot=None)
    with pytest.raises(AssertionError):
        decide(due=minutes_ago(0, 1), now=NOW, policy=Policy(), active=False, buffered=False, last_slot=None)
