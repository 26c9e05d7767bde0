"""Workflow runs on the engine, bodies run in the test process (tests/inprocess.py): the state
merged by top-level key, each lease carrying its predecessors' outputs, a fan-in started exactly
once, signals, waits, cancellation, versions, and bad input that changes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows import selectors, services
from flows.models import Run, RunStep
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
    with pytest.raises(services.IdempotencyConflict):
        services.start_run(definition="fan", version=1, input={"log": "other"}, idempotency_key="k-1", actor="alice")
    assert (Run.objects.count(), RunStep.objects.count(), Job.objects.count()) == counts
