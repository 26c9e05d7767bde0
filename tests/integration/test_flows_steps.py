"""A workflow's step attempts are ordinary attempts: the fence picks one winner, a late report of a
cancelled run's step is refused by name, a repeated parent completion neither loses nor doubles
the fan-in, a worker lacking the version leaves the step queued (unservable, no attempt used), a
charge is sent once across retries, a critical charge makes the run wait for its approval, and
a stranded run moves to a served version. Attempts are claimed and ended here through the engine's
own services, as a worker would (tests/inprocess.py runs the bodies where a body must run)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from flows import selectors, services
from flows.models import Run, RunStep
from koala.models import AuditEvent
from tests.inprocess import drain, drain_until
from tests.kinds import world_effects
from workers import kinds, outcomes, transitions
from workers.errors import Rejection
from workers.hooks import Transition
from workers.models import Attempt, Job, WorkerProcess
from workers.services import leases
from workers.services.leases import Lease

# transaction=True throughout: the steps' jobs are claimed (the claim compares with now()).
pytestmark = pytest.mark.django_db(transaction=True)


def _steps(run_id: int) -> dict[str, RunStep]:
    return {row.name: row for row in RunStep.objects.filter(run_id=run_id)}


def _claim(job_id: int, worker: str) -> Lease:
    lease = leases.claim_job(job_id=job_id, worker=worker, lease_seconds=30)
    assert lease is not None, f"job {job_id} was not claimable"
    return lease


def _complete(lease: Lease, value: Any, delta: dict[str, Any]) -> Rejection | None:
    kind = kinds.get(lease.kind, lease.version)
    return transitions.end_attempt(outcomes.decide(outcomes.Returned(value=value, state_delta=delta), lease, kind), lease)


def _finished(run_id: int) -> Run | None:
    run = Run.objects.get(pk=run_id)
    return run if run.state in ("succeeded", "failed", "cancelled") else None


def test_a_steps_lease_carries_its_step_its_parents_outputs_the_run_and_a_stable_key(tmp_path: Path) -> None:
    from api.protocol import lease_payload, span_id_of

    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    a = _claim(_steps(run.pk)["a"].job_id or 0, "w1")
    assert (a.step, a.run_id, a.steps) == ("a", run.pk, {})
    assert _complete(a, {"out": "a"}, {"k": 1}) is None
    b = _claim(_steps(run.pk)["b"].job_id or 0, "w1")
    payload = lease_payload(b, worker_id="w1")
    assert payload["step"] == "b" and payload["steps"] == {"a": {"out": "a"}}
    assert payload["run"] == {"id": run.pk, "state": {"k": 1}, "correlation_id": run.trace_id}
    assert payload["state"] == {"k": 1} and payload["trace_id"] == services.trace_id_of(run.pk)
    assert payload["idempotency_key"] == f"koala-run-{run.pk}-b"
    # Each attempt is its own span in the run's trace: a retry's lease names a new one, never a's.
    retried = dataclasses.replace(b, lease_token=b.lease_token + 5, attempt_id=b.attempt_id + 5, attempts=2)
    assert len({span_id_of(a), span_id_of(b), span_id_of(retried)}) == 3
    assert payload["span_id"] == span_id_of(b)
    assert retried.trace_id == b.trace_id == a.trace_id


def test_two_workers_racing_one_step_have_one_winner_and_the_losers_report_changes_nothing(tmp_path: Path) -> None:
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    job_id = _steps(run.pk)["a"].job_id or 0
    first = _claim(job_id, "w1")
    # w1 goes silent: its lease expires, the reaper requeues the step, w2 claims it.
    Job.objects.filter(pk=job_id).update(lease_expires_at=timezone.now() - timezone.timedelta(seconds=5))
    transitions.reap(grace_seconds=0)
    second = _claim(job_id, "w2")
    assert _complete(second, {"by": "w2"}, {"winner": "w2"}) is None
    state_after = Run.objects.get(pk=run.pk).run_state
    assert _complete(first, {"by": "w1"}, {"winner": "w1"}) == Rejection.LEASE_SUPERSEDED
    assert Run.objects.get(pk=run.pk).run_state == state_after == {"winner": "w2"}
    assert _steps(run.pk)["a"].output == {"by": "w2"}
    assert Job.objects.filter(run_id=run.pk, step="b").count() == 1 and Job.objects.filter(run_id=run.pk, step="c").count() == 1


def test_a_repeated_parent_completion_neither_loses_nor_doubles_the_fan_in(tmp_path: Path) -> None:
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    assert _complete(_claim(_steps(run.pk)["a"].job_id or 0, "w"), "a", {}) is None
    b = _claim(_steps(run.pk)["b"].job_id or 0, "w")
    c = _claim(_steps(run.pk)["c"].job_id or 0, "w")
    assert _complete(b, "b", {"b": 1}) is None
    told = Transition(
        job_id=b.job_id,
        kind=b.kind,
        version=b.version,
        queue=b.queue,
        state="succeeded",
        outcome="succeeded",
        failure_reason=None,
        cause="attempt",
        result="b again",
        state_delta={"b": 99},
    )
    with transaction.atomic():
        services.on_transitions([told])  # the hook told twice of b's completion (a repeated report)
    assert _steps(run.pk)["d"].state == "pending"  # c is not done: not due, not lost
    assert _complete(c, "c", {"c": 1}) is None
    with transaction.atomic():
        services.on_transitions([told])  # and again, after the fan-in became due
        services.on_transitions([dataclass_replace(told, job_id=c.job_id, kind=c.kind)])
    assert Job.objects.filter(run_id=run.pk, step="d").count() == 1
    assert _steps(run.pk)["b"].output == "b" and Run.objects.get(pk=run.pk).run_state == {"b": 1, "c": 1}
    d = _claim(_steps(run.pk)["d"].job_id or 0, "w")
    assert d.steps == {"a": "a", "b": "b", "c": "c"}


def dataclass_replace(change: Transition, **values: Any) -> Transition:
    return dataclasses.replace(change, **values)


def test_cancelling_a_run_cancels_its_steps_and_a_late_completion_is_refused_by_name(tmp_path: Path) -> None:
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    assert _complete(_claim(_steps(run.pk)["a"].job_id or 0, "w"), "a", {"a": 1}) is None
    running = _claim(_steps(run.pk)["b"].job_id or 0, "w")  # b runs; c stays queued
    cancelled = services.cancel_run(run_id=run.pk, actor="alice", reason="no longer needed")
    assert cancelled.state == "cancelled" and cancelled.finished_at is not None
    jobs = {j.step: j for j in Job.objects.filter(run_id=run.pk)}
    assert jobs["b"].state == jobs["c"].state == "cancelled"
    # The running body hears it at its heartbeat, and its late report is refused by name.
    assert leases.heartbeat(job_id=running.job_id, lease_token=running.lease_token, lease_seconds=30) == Rejection.JOB_CANCELLED
    assert _complete(running, "late", {"late": True}) == Rejection.JOB_CANCELLED
    after = Run.objects.get(pk=run.pk)
    assert after.state == "cancelled" and after.run_state == {"a": 1}
    assert {s.name: s.state for s in RunStep.objects.filter(run_id=run.pk)} == {
        "a": "succeeded",
        "b": "cancelled",
        "c": "cancelled",
        "d": "cancelled",
    }
    assert AuditEvent.objects.filter(action="run.cancel", target_id=str(run.pk), actor="alice").count() == 1
    with pytest.raises(services.RunFinished):
        services.cancel_run(run_id=run.pk, actor="alice")


def test_a_run_failing_on_one_branch_cancels_the_running_steps_of_the_others(tmp_path: Path) -> None:
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    assert _complete(_claim(_steps(run.pk)["a"].job_id or 0, "w"), "a", {}) is None
    b = _claim(_steps(run.pk)["b"].job_id or 0, "w")
    c = _claim(_steps(run.pk)["c"].job_id or 0, "w")
    failed = outcomes.decide(outcomes.Raised.of(ValueError("no")), b, kinds.get(b.kind, b.version))
    assert transitions.end_attempt(failed, b) is None
    assert Run.objects.get(pk=run.pk).state == "failed"
    assert Job.objects.get(pk=c.job_id).state == "cancelled"  # its cancel signal fired when the run ended
    assert leases.heartbeat(job_id=c.job_id, lease_token=c.lease_token, lease_seconds=30) == Rejection.JOB_CANCELLED


def test_a_worker_without_the_runs_version_leaves_the_step_queued_without_using_an_attempt(tmp_path: Path) -> None:
    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    job_id = _steps(run.pk)["a"].job_id or 0
    # An RQ worker serving only version 2 never claims it (the claim filters on kind@version) ...
    assert leases.claim_job(job_id=job_id, worker="w2", lease_seconds=30, served=["fan.a@2"]) is None
    # ... and one that claimed it anyway (an HTTP worker without the step's body) answers unservable.
    lease = _claim(job_id, "http-w")
    assert transitions.end_attempt(transitions.unservable(lease, worker="http-w"), lease) is None
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts) == ("queued", 0)
    assert Attempt.objects.get(job_id=job_id).outcome == "unservable"
    assert _steps(run.pk)["a"].state == "queued" and Run.objects.get(pk=run.pk).state == "running"


def test_a_stranded_run_is_listed_and_moved_to_a_served_version(tmp_path: Path) -> None:
    log = tmp_path / "e"
    now = timezone.now()
    v2 = [f"fan.{s}@2" for s in "abcd"]
    WorkerProcess.objects.create(
        name="rq.v2", hostname="h", pid=1, queues=["default"], kinds=v2, worker_class="rq", started_at=now, last_seen_at=now
    )
    run = services.start_run(definition="fan", version=1, input={"log": str(log)}, actor="a").run
    stranded = selectors.stranded_runs()
    assert [(s.run_id, s.version, s.missing, s.served_versions) for s in stranded] == [(run.pk, 1, ["fan.a@1"], [2])]
    old_job = _steps(run.pk)["a"].job_id
    moved = services.move_to_version(run_id=run.pk, to_version=2, actor="ops")
    assert moved.version == 2 and moved.state == "running"
    assert Job.objects.get(pk=old_job).state == "cancelled"
    a = _steps(run.pk)["a"]
    assert a.job_id != old_job and Job.objects.get(pk=a.job_id).version == 2 and a.version == 2
    assert selectors.stranded_runs() == []
    assert AuditEvent.objects.filter(action="run.move", target_id=str(run.pk), actor="ops").get().details == {
        "from_version": 1,
        "to_version": 2,
    }
    done = drain_until(lambda: _finished(run.pk), what="the moved run to finish")
    assert done.state == "succeeded" and _steps(run.pk)["d"].output["version"] == 2
    with pytest.raises(services.RunFinished):
        services.move_to_version(run_id=run.pk, to_version=1, actor="ops")


def test_a_charging_step_charges_once_across_its_retries(tmp_path: Path) -> None:
    world = tmp_path / "world"
    run = services.start_run(
        definition="pay",
        input={"log": str(tmp_path / "e"), "world": str(world), "amount": 500, "retry_after_charge": True},
        actor="a",
    ).run
    done = drain_until(lambda: _finished(run.pk), what="the run to finish")
    assert done.state == "succeeded"
    charge = Job.objects.get(run_id=run.pk, step="charge")
    assert charge.attempts == 2
    assert len(world_effects(str(world))) == 1  # the provider's own record: one charge
    view = selectors.run_view(run.pk)
    assert view is not None and view.cost_minor == 500 and [o.state for o in view.steps[0].operations] == ["succeeded"]


def test_a_critical_charge_makes_the_run_wait_for_its_approval(tmp_path: Path, settings: Any) -> None:
    from reviews.models import ReviewRequest
    from reviews.services import approve_review
    from tests.support.console import ensure_roles, make_user

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    ensure_roles()
    make_user("rita", "reviewers")
    world = tmp_path / "world"
    run = services.start_run(
        definition="pay", input={"log": str(tmp_path / "e"), "world": str(world), "amount": 20_000}, actor="alice"
    ).run
    drain_until(lambda: Run.objects.get(pk=run.pk).state == "waiting", what="the run to wait for the review")
    assert _steps(run.pk)["charge"].state == "parked" and world_effects(str(world)) == []
    review = ReviewRequest.objects.get(job_id=_steps(run.pk)["charge"].job_id)
    approve_review(review_id=review.pk, actor="rita")
    assert Run.objects.get(pk=run.pk).state == "running"  # the unpark resumed it
    done = drain_until(lambda: _finished(run.pk), what="the approved run to finish")
    assert done.state == "succeeded" and len(world_effects(str(world))) == 1
    drain()


def _waiting_on_locks() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
        return int(cursor.fetchone()[0])


def _until(check: Any, what: str, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_completion_racing_a_cancel_is_either_recorded_in_the_run_or_refused_by_name(tmp_path: Path) -> None:
    """The cancel takes the run first, then its completion arrives: the completion must not be
    accepted on the job while the run (already cancelled) ignores it. Forced order: a third
    session holds the run's row; the cancel queues on it, then the completion of the running
    step; the holder lets go."""
    import threading

    run = services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "e")}, actor="a").run
    assert _complete(_claim(_steps(run.pk)["a"].job_id or 0, "w"), "a", {"a": 1}) is None
    running = _claim(_steps(run.pk)["b"].job_id or 0, "w")
    answers: dict[str, Any] = {}
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        from django.db import connection

        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=run.pk)
                held.set()
                release.wait(20)
        finally:
            connection.close()

    def cancel() -> None:
        from django.db import connection

        try:
            answers["cancel"] = services.cancel_run(run_id=run.pk, actor="alice", reason="race").state
        finally:
            connection.close()

    def complete() -> None:
        from django.db import connection

        try:
            answers["complete"] = _complete(running, "b-done", {"b": 2})
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    try:
        canceller = threading.Thread(target=cancel)
        canceller.start()
        _until(lambda: _waiting_on_locks() >= 1, "the cancel to wait on a lock")
        completer = threading.Thread(target=complete)
        completer.start()
        _until(lambda: _waiting_on_locks() >= 2, "the completion to wait on a lock")
    finally:
        release.set()
        holder.join(20)
    canceller.join(20)
    completer.join(20)
    assert answers.get("cancel") == "cancelled"
    job = Job.objects.get(pk=running.job_id)
    step = _steps(run.pk)["b"]
    if answers["complete"] is None:  # accepted: then the run recorded it before it was cancelled
        assert job.state == "succeeded" and step.state == "succeeded" and step.output == "b-done"
        assert Run.objects.get(pk=run.pk).run_state == {"a": 1, "b": 2}
    else:  # refused by name: nothing of it anywhere
        assert answers["complete"] == Rejection.JOB_CANCELLED
        assert job.state == "cancelled" and step.state == "cancelled"
        assert Run.objects.get(pk=run.pk).run_state == {"a": 1}
