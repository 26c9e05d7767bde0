"""Workflow runs on the engine, bodies run in the test process (tests/inprocess.py): the state
merged by top-level key, each lease carrying its predecessors' outputs, a fan-in started exactly
once, signals, waits, cancellation, versions, and bad input that changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows import selectors, services
from flows.errors import IdempotencyConflict
from flows.models import Run, RunStep, Signal
from tests.inprocess import drain_until
from tests.kinds import effect_lines
from workers.models import Job


def _run(run_id: int) -> Run:
    return Run.objects.get(pk=run_id)


def _finished(run_id: int) -> Run | None:
    run = _run(run_id)
    return run if run.state in ("succeeded", "failed", "cancelled") else None


def _steps(run_id: int) -> dict[str, RunStep]:
    return {row.name: row for row in RunStep.objects.filter(run_id=run_id)}


def _ran(log: Path) -> list[str]:
    return [line[0] for line in effect_lines(str(log))]


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_a_fan_out_fan_in_run_merges_state_and_hands_each_step_its_parents_outputs(tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    started = services.start_run(definition="fan", version=1, input={"log": str(log)}, actor="alice")
    assert started.created and started.run.state == "running"
    run = drain_until(lambda: _finished(started.run.pk), what="the run to finish")
    assert run.state == "succeeded", run.error
    assert sorted(_ran(log)) == ["a", "b", "c", "d"]  # each step exactly once
    steps = _steps(run.pk)
    assert steps["a"].output == {"step": "a", "seen": []}
    # b and c each saw a's output, and the state as a left it (siblings don't see each other's delta).
    assert steps["b"].output["seen"] == {"a": {"step": "a", "seen": []}}
    assert steps["b"].output["state"] == {"stage": "a", "a": 1}
    assert steps["c"].output["state"] == {"stage": "a", "a": 1}
    d_seen = steps["d"].output["seen"]
    assert set(d_seen) == {"a", "b", "c"} and d_seen["b"]["step"] == "b" and d_seen["c"]["step"] == "c"
    assert steps["d"].output["state"]["b"] == 2 and steps["d"].output["state"]["c"] == 3
    # Top-level keys replaced: the last writer of "stage" is d.
    assert run.run_state == {"stage": "d", "a": 1, "b": 2, "c": 3}
    assert steps["a"].state_after == {"stage": "a", "a": 1}
    jobs = Job.objects.filter(run_id=run.pk)
    assert jobs.count() == 4 and {j.trace_id for j in jobs} == {run.trace_id} == {services.trace_id_of(run.pk)}
    view = selectors.run_view(run.pk)
    assert view is not None and [s.name for s in view.steps] == ["a", "b", "c", "d"]
    assert all(s.attempts and s.attempts[0].outcome == "succeeded" and s.attempts[0].worker_id for s in view.steps)


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_the_same_key_and_input_is_the_same_run_and_other_input_is_refused(tmp_path: Path) -> None:
    data: dict[str, Any] = {"log": str(tmp_path / "e.log")}
    first = services.start_run(definition="fan", version=1, input=data, idempotency_key="k-1", actor="alice")
    again = services.start_run(definition="fan", version=1, input=dict(data), idempotency_key="k-1", actor="alice")
    assert again.run.pk == first.run.pk and not again.created
    counts = (Run.objects.count(), RunStep.objects.count(), Job.objects.count())
    with pytest.raises(IdempotencyConflict):
        services.start_run(definition="fan", version=1, input={"log": "other"}, idempotency_key="k-1", actor="alice")
    assert (Run.objects.count(), RunStep.objects.count(), Job.objects.count()) == counts


def _counts() -> tuple[int, ...]:
    from koala.models import AuditEvent

    return (Run.objects.count(), RunStep.objects.count(), Signal.objects.count(), Job.objects.count(), AuditEvent.objects.count())


@pytest.mark.django_db
def test_bad_input_is_a_named_error_and_changes_nothing(tmp_path: Path) -> None:
    from flows import errors

    good = {"log": str(tmp_path / "e.log")}
    run = services.start_run(definition="ticket", input=good, actor="alice").run
    before = _counts()
    cases: list[tuple[type[errors.FlowError], dict[str, Any]]] = [
        (errors.UnknownDefinition, {"definition": "nope", "input": good}),
        (errors.UnknownVersion, {"definition": "fan", "version": 9, "input": good}),
        (errors.BadInput, {"definition": "fan", "version": 1, "input": {}}),  # a required field missing
        (errors.BadInput, {"definition": "fan", "version": 1, "input": ["not", "an", "object"]}),
        (errors.BadInput, {"definition": "fan", "version": 1, "input": {"log": "x", "nan": float("nan")}}),
        (errors.BadInput, {"definition": "fan", "version": 1, "input": {"log": "x" * 20_000}}),
    ]
    for error, arguments in cases:
        with pytest.raises(error) as raised:
            services.start_run(actor="alice", **arguments)
        assert raised.value.code == error.code
    with pytest.raises(errors.SignalTooLarge):
        services.send_signal(run_id=run.pk, name="reviewer.approved", key="k", payload={"x": "y" * 17_000}, actor="bob")
    with pytest.raises(errors.BadSignal):
        services.send_signal(run_id=run.pk, name="", key="k", payload={}, actor="bob")
    with pytest.raises(errors.UnknownRun):
        services.send_signal(run_id=run.pk + 1000, name="go", key="k", payload={}, actor="bob")
    services.start_run(definition="fan", version=1, input=good, idempotency_key="used", actor="alice")
    before = _counts()
    with pytest.raises(errors.IdempotencyConflict):
        services.start_run(definition="fan", version=1, input={"log": "elsewhere"}, idempotency_key="used", actor="alice")
    assert _counts() == before


@pytest.mark.django_db
def test_pending_signals_are_limited_per_run(tmp_path: Path) -> None:
    from flows import errors
    from workers.definitions import MAX_PENDING_SIGNALS

    run = services.start_run(definition="ticket", input={"log": str(tmp_path / "e.log")}, actor="alice").run
    for n in range(MAX_PENDING_SIGNALS):
        assert services.send_signal(run_id=run.pk, name="other", key=f"k{n}", payload={}, actor="bob").outcome == "buffered"
    before = _counts()
    with pytest.raises(errors.TooManyPendingSignals):
        services.send_signal(run_id=run.pk, name="other", key="one-more", payload={}, actor="bob")
    assert _counts() == before


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_a_signal_sent_before_the_wait_exists_is_buffered_then_consumed_once(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    run = services.start_run(definition="ticket", input={"log": str(log)}, actor="alice").run
    # 1 ms after the start: classify has not run, the wait does not exist yet.
    first = services.send_signal(run_id=run.pk, name="reviewer.approved", key="rev-1", payload={"by": "bob"}, actor="bob")
    assert first.outcome == "buffered"
    again = services.send_signal(run_id=run.pk, name="reviewer.approved", key="rev-1", payload={"by": "eve"}, actor="eve")
    assert again.outcome == "duplicate" and again.signal_id == first.signal_id
    done = drain_until(lambda: _finished(run.pk), what="the run to finish")
    assert done.state == "succeeded"
    steps = _steps(run.pk)
    assert steps["approval"].output == {"by": "bob"}
    assert steps["send"].output == {"sent": True, "approval": {"by": "bob"}}
    signal = Signal.objects.get(pk=first.signal_id)
    assert (signal.status, signal.consumed_by) == ("consumed", "approval")
    assert Signal.objects.filter(run_id=run.pk).count() == 1
    assert _ran(log) == ["classify", "send"]
    late = services.send_signal(run_id=run.pk, name="reviewer.approved", key="rev-2", payload={}, actor="bob")
    assert late.outcome == "rejected" and late.signal_id is None
    assert Signal.objects.filter(run_id=run.pk).count() == 1


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_a_run_waits_for_its_signal_and_the_signal_resumes_it(tmp_path: Path) -> None:
    run = services.start_run(definition="ticket", input={"log": str(tmp_path / "e.log")}, actor="alice").run
    drain_until(lambda: _run(run.pk).state == "waiting", what="the run to wait")
    assert _steps(run.pk)["approval"].state == "waiting" and _steps(run.pk)["send"].state == "pending"
    answer = services.send_signal(run_id=run.pk, name="reviewer.approved", key="r", payload={"ok": True}, actor="bob")
    assert answer.outcome == "resumed" and _run(run.pk).state == "running"
    assert drain_until(lambda: _finished(run.pk)).state == "succeeded"


@pytest.mark.django_db(transaction=True)  # the beat and the bodies need committed rows
@pytest.mark.parametrize(
    ("policy", "state", "after_state", "last_state"),
    [
        ("continue", "succeeded", "succeeded", "succeeded"),
        ("skip", "succeeded", "skipped", "succeeded"),
        ("fail", "failed", "cancelled", "cancelled"),
    ],
)
def test_a_timed_out_wait_follows_its_policy(tmp_path: Path, policy: str, state: str, after_state: str, last_state: str) -> None:
    log = tmp_path / "e.log"
    run = services.start_run(definition=f"wait_{policy}", input={"log": str(log)}, actor="alice").run
    assert run.state == "waiting"

    def ended() -> Run | None:
        services.expire_waits()
        return _finished(run.pk)

    done = drain_until(ended, what="the wait to time out and the run to end")
    assert done.state == state
    steps = _steps(run.pk)
    assert (steps["after"].state, steps["last"].state) == (after_state, last_state)
    if policy == "continue":
        assert steps["signal"].output == {"timed_out": True}
        assert steps["after"].output == {"seen": {"signal": {"timed_out": True}}}
    if policy == "skip":
        assert steps["last"].output["seen"]["after"] == {"skipped": True}
    if policy == "fail":
        assert done.error_code == "wait_timed_out" and _ran(log) == []


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_a_state_too_large_fails_the_step_by_name_and_merges_nothing(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    run = services.start_run(definition="fan", version=1, input={"log": str(log), "huge": "c"}, actor="alice").run
    done = drain_until(lambda: _finished(run.pk), what="the run to end")
    assert done.state == "failed" and done.error_code == "run_state_too_large"
    c = _steps(run.pk)["c"]
    assert c.state == "failed" and c.error_code == "run_state_too_large" and c.output is None
    job = Job.objects.get(pk=c.job_id)
    assert (job.state, job.error_class, job.result) == ("failed", "RunStateTooLarge", None)
    assert job.attempt_set.get().outcome == "failed"
    assert "blob" not in done.run_state and "d" not in _ran(log)


@pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows
def test_a_failed_step_fails_the_run_and_its_fan_in_never_runs(tmp_path: Path) -> None:
    log = tmp_path / "e.log"
    run = services.start_run(definition="fan", version=1, input={"log": str(log), "fail": "b"}, actor="alice").run
    done = drain_until(lambda: _finished(run.pk), what="the run to end")
    assert done.state == "failed" and "step b failed" in done.error
    steps = _steps(run.pk)
    assert steps["b"].state == "failed" and steps["d"].state == "cancelled" and steps["d"].job_id is None
    assert "d" not in _ran(log)
    # Nothing of the run is left live in the engine.
    assert not Job.objects.filter(run_id=run.pk, state__in=["queued", "running", "parked"]).exists()


@pytest.mark.django_db
def test_a_steps_kind_is_not_enqueued_outside_a_run() -> None:
    """A step's job belongs to a run: one enqueued alone would run with no run, no parents and no
    state, and nothing would hang on its end. The enqueue names why and writes nothing."""
    from workers import EnqueueError, enqueue

    before = Job.objects.count()
    with pytest.raises(EnqueueError, match=r"step .a. of workflow fan; start a run"):
        enqueue(kind="fan.a", input={"log": "/dev/null"}, created_by="tester")
    assert Job.objects.count() == before
