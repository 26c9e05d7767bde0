"""Workflow runs on real RQ worker subprocesses (tests.conftest.worker_env: lease 3 s, heartbeat
0.5 s, grace 0.5 s, beat every 0.2 s), asserted on rows and on the effect file the step bodies
append to (the outside world's record of how many times each body ran)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from flows import services
from flows.models import Run, RunStep
from tests.conftest import wait_for
from tests.kinds import effect_lines
from tests.support.fleet import kill_if_ours
from workers.models import Attempt, Job, WorkerProcess

# transaction=True: the worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _lines(log: Path) -> list[list[str]]:
    return effect_lines(str(log))


def _ended(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.state in ("succeeded", "failed", "cancelled") else None


def test_a_fan_out_fan_in_run_on_rq_workers_survives_kill_9_between_a_completion_and_its_dependants(processes, tmp_path) -> None:
    log = tmp_path / "effects.log"
    processes.beat()
    processes.worker("--name", "flows-w1", "--worker-class", "simple")
    processes.worker("--name", "flows-w2", "--worker-class", "simple")
    wait_for(
        lambda: WorkerProcess.objects.filter(name__startswith="flows-w", stopped_at__isnull=True).count() == 2, what="two workers"
    )
    # b dawdles: the worker that takes it is killed after a's completion made b and c due, before b ends.
    run = services.start_run(definition="fan", version=1, input={"log": str(log), "pause": {"b": 3}}, actor="t").run
    started_b = wait_for(lambda: [line for line in _lines(log) if line[0] == "b"], timeout=30, what="b to start")
    assert isinstance(started_b, list)
    kill_if_ours(int(started_b[0][4]), signal.SIGKILL)
    done = wait_for(lambda: _ended(run.pk), timeout=60, what="the run to end after the kill")
    assert isinstance(done, Run) and done.state == "succeeded", done.error if isinstance(done, Run) else done
    ran = [line[0] for line in _lines(log)]
    # Each step's job exactly once; b's body ran again after the kill, every other body once.
    assert {s: Job.objects.filter(run_id=run.pk, step=s).count() for s in "abcd"} == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert (ran.count("a"), ran.count("c"), ran.count("d")) == (1, 1, 1) and ran.count("b") == 2
    b_job = Job.objects.get(run_id=run.pk, step="b")
    assert [a.outcome for a in Attempt.objects.filter(job=b_job).order_by("number")] == ["orphaned", "succeeded"]
    assert done.run_state == {"stage": "d", "a": 1, "b": 2, "c": 3}
    d = RunStep.objects.get(run=run, name="d")
    assert set(d.output["seen"]) == {"a", "b", "c"}
    # The journal answers which worker ran each step.
    workers = {
        a.job.step: a.worker_id for a in Attempt.objects.filter(job__run_id=run.pk, outcome="succeeded").select_related("job")
    }
    assert set(workers) == {"a", "b", "c", "d"} and all(w.startswith("flows-w") for w in workers.values())
