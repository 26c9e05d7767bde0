"""Retention (workers.services.retention): old finished jobs go with what hangs on them; live work,
open operations, live runs, young jobs and the audit log stay; passes are bounded; nobody waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from datetime import datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, connections

from flows import services as flows_services
from flows.models import Run, RunStep
from koala.models import AuditEvent
from tests.inprocess import drain, drain_until
from traces.models import Span
from workers import hooks
from workers.models import Attempt, Job, Operation
from workers.services import leases, retention
from workers.services.jobs import JobSpec, cancel_job, enqueue, enqueue_many, retry_job

pytestmark = pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows


def _finished(count: int, *, key: str = "") -> list[int]:
    """``count`` noop jobs run to success by the real runtime (each with an attempt and its span)."""
    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={"i": i, "k": key}) for i in range(count)])]
    drain_until(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == count, what="the jobs to finish")
    return ids


def _age(ids: Sequence[int], days: int = 40) -> None:
    """Pretend the jobs finished ``days`` ago (and were created before that)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workers_job SET finished_at = now() - make_interval(days => %s), "
            "created_at = now() - make_interval(days => %s + 1) WHERE id = ANY(%s)",
            [days, days, list(ids)],
        )


def _operation(job_id: int, state: str, name: str = "send") -> Operation:
    return Operation.objects.create(
        job_id=job_id,
        lease_token=1,
        name=name,
        key=f"k-{job_id}-{name}",
        kind="email",
        fingerprint="f",
        state=state,
        resolution="found" if state == "reconciled" else "",
    )


def _left(ids: Sequence[int]) -> set[int]:
    return set(Job.objects.filter(pk__in=ids).values_list("pk", flat=True))


def test_old_finished_jobs_go_with_their_attempts_operations_and_spans_and_young_ones_stay(redis_clean: None) -> None:
    old, young = _finished(3), _finished(2)
    cancelled = enqueue(kind="noop", input={"cancel": 1}, delay_seconds=3600).job_id
    cancel_job(job_id=cancelled, actor="alice")  # an audit row naming the job
    _age([*old, cancelled])
    _operation(old[0], "succeeded")
    _operation(old[1], "failed", name="charge")  # definitely did not happen: nothing open
    assert Span.objects.filter(job_id__in=old).count() == 3  # each attempt's span
    audit = AuditEvent.objects.count()
    assert audit >= 1

    report = retention.prune(days=30)

    assert (report.jobs, report.attempts, report.operations, report.kept) == (4, 3, 2, 0)
    assert report.apps["traces"] == 3
    assert _left([*old, cancelled, *young]) == set(young)
    assert not Attempt.objects.filter(job_id__in=old).exists() and not Span.objects.filter(job_id__in=old).exists()
    assert Attempt.objects.filter(job_id__in=young).count() == 2 and Span.objects.filter(job_id__in=young).count() == 2
    assert AuditEvent.objects.count() == audit  # the audit trail is kept
    assert AuditEvent.objects.filter(target_id=str(cancelled)).exists()
    assert retention.prune(days=30).jobs == 0  # nothing left to do
    assert retention.prune(days=0).jobs == 0 and _left(young) == set(young)  # 0: retention off


def test_live_jobs_and_jobs_with_open_operations_stay(redis_clean: None) -> None:
    queued = enqueue(kind="noop", input={"q": 1}, delay_seconds=3600).job_id
    running = enqueue(kind="noop", input={"r": 1}).job_id
    assert leases.claim_job(job_id=running, worker="w", lease_seconds=30) is not None
    parked = enqueue(kind="noop", input={"p": 1}, delay_seconds=3600).job_id
    Job.objects.filter(pk=parked).update(state="parked", park_reason="budget")
    in_flight, uncertain, reconciled = _finished(3)
    _operation(in_flight, "in_flight")
    _operation(uncertain, "uncertain")
    _operation(reconciled, "reconciled")
    everything = [queued, running, parked, in_flight, uncertain, reconciled]
    _age(everything)  # even with an old finished_at, a live job is not finished

    report = retention.prune(days=30)

    assert report.jobs == 1 and _left(everything) == {queued, running, parked, in_flight, uncertain}
    assert Operation.objects.filter(job_id__in=[in_flight, uncertain]).count() == 2
    assert Attempt.objects.filter(job_id=in_flight).count() == 1
    out = StringIO()
    call_command("koala_prune", "--dry-run", stdout=out)
    assert "0 jobs and 0 attempts would be pruned" in out.getvalue() and "2 jobs kept by an open operation" in out.getvalue()


def test_a_retried_job_stays_while_its_retry_is_live_or_young(redis_clean: None) -> None:
    original = enqueue(kind="noop", input={"o": 1}, delay_seconds=3600).job_id
    cancel_job(job_id=original, actor="alice")
    again = retry_job(job_id=original, actor="alice").job_id
    _age([original])
    assert retention.prune(days=30).jobs == 0 and _left([original, again]) == {original, again}
    drain_until(lambda: Job.objects.get(pk=again).state == "succeeded", what="the retry to finish")
    assert retention.prune(days=30).jobs == 0  # the retry is young
    _age([again], days=35)
    assert retention.prune(days=30).jobs == 2 and not _left([original, again])


def test_an_idempotency_key_is_free_again_once_its_job_is_pruned(redis_clean: None) -> None:
    first = enqueue(kind="noop", input={}, idempotency_key="order-1")
    drain_until(lambda: Job.objects.get(pk=first.job_id).state == "succeeded", what="the job to finish")
    assert enqueue(kind="noop", input={}, idempotency_key="order-1").job_id == first.job_id  # inside the window
    _age([first.job_id])
    assert retention.prune(days=30).jobs == 1
    assert enqueue(kind="noop", input={}, idempotency_key="order-1").job_id != first.job_id  # a new job


def _age_run(run_id: int, days: int = 40) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE flows_run SET finished_at = now() - make_interval(days => %s) WHERE id = %s AND finished_at IS NOT NULL",
            [days, run_id],
        )


def test_jobs_of_live_or_young_runs_stay_and_an_old_finished_run_goes_with_its_last_job(
    redis_clean: None, tmp_path: Path
) -> None:
    waiting = flows_services.start_run(definition="ticket", input={"log": str(tmp_path / "t.log")}, actor="alice").run
    done = flows_services.start_run(definition="fan", version=1, input={"log": str(tmp_path / "f.log")}, actor="alice").run
    drain_until(lambda: Run.objects.get(pk=done.pk).state == "succeeded", what="the fan run to finish")
    drain_until(lambda: Run.objects.get(pk=waiting.pk).state == "waiting", what="the ticket run to wait")
    waiting_jobs = list(Job.objects.filter(run_id=waiting.pk, state="succeeded").values_list("pk", flat=True))
    done_jobs = list(Job.objects.filter(run_id=done.pk).values_list("pk", flat=True))
    assert waiting_jobs and len(done_jobs) == 4
    _age([*waiting_jobs, *done_jobs])

    # The finished run is young: its journal keeps every step's job.
    report = retention.prune(days=30)
    assert report.jobs == 0 and report.kept == len(waiting_jobs) + 4

    _age_run(done.pk)
    report = retention.prune(days=30)
    assert report.jobs == 4 and report.kept == len(waiting_jobs)
    assert not Run.objects.filter(pk=done.pk).exists() and not RunStep.objects.filter(run_id=done.pk).exists()
    assert _left(waiting_jobs) == set(waiting_jobs) and Run.objects.get(pk=waiting.pk).state == "waiting"
    assert RunStep.objects.filter(run_id=waiting.pk, job_id__in=waiting_jobs).count() == len(waiting_jobs)


def test_a_pass_is_bounded_and_the_next_pass_takes_the_rest(redis_clean: None) -> None:
    ids = _finished(25)
    _age(ids)
    first = retention.prune(days=30, batch_size=10, batches=2)
    assert (first.jobs, first.batches) == (20, 2) and len(_left(ids)) == 5
    # Oldest first: the five left are the youngest of them.
    assert _left(ids) == set(Job.objects.filter(pk__in=ids).order_by("-finished_at", "-id").values_list("pk", flat=True)[:5])
    second = retention.prune(days=30, batch_size=10, batches=2)
    assert (second.jobs, second.batches) == (5, 1) and not _left(ids)


def test_kept_jobs_do_not_stop_a_pass_from_reaching_the_prunable_ones_behind_them(redis_clean: None) -> None:
    kept, prunable = _finished(6), _finished(4)
    _age(kept, days=50)  # the oldest: every batch would start with them
    _age(prunable, days=40)
    hooks.register_retention("test-keep", keep=lambda ids, cutoff: set(ids) & set(kept))
    try:
        report = retention.prune(days=30, batch_size=3, batches=4)
    finally:
        hooks.unregister_retention("test-keep")
    assert (report.jobs, report.kept) == (4, 6) and _left(kept) == set(kept) and not _left(prunable)


def test_a_concurrent_claim_and_a_second_pruner_never_wait_for_a_pass(redis_clean: None) -> None:
    """A pass holds its batch's locks (the test's keep hook pauses it inside the transaction):
    meanwhile a worker enqueues, claims, runs and completes a job, and a second pass prunes other
    rows, each under a 2 s lock_timeout: neither waits on the first pass."""
    held, other = _finished(1), _finished(1)
    _age(held, days=50)
    _age(other, days=40)
    inside, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def hold(ids: Sequence[int], cutoff: datetime) -> set[int]:
        if threading.current_thread().name == "pruner":
            inside.set()
            release.wait(30)
        return set()

    def first_pass() -> None:
        try:
            results["first"] = retention.prune(days=30, batch_size=1, batches=1)
        finally:
            connections.close_all()

    hooks.register_retention("test-hold", keep=hold)
    pruner = threading.Thread(target=first_pass, name="pruner")
    try:
        pruner.start()
        assert inside.wait(20), "the first pass never reached its batch"
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        started = time.monotonic()
        job_id = enqueue(kind="noop", input={"while": "pruning"}).job_id
        drain(job_id=job_id)
        assert Job.objects.get(pk=job_id).state == "succeeded"
        second = retention.prune(days=30, batch_size=1, batches=5)
        assert second.jobs == 1 and _left(other) == set() and _left(held) == set(held)  # the held row was skipped
        assert time.monotonic() - started < 10
    finally:
        release.set()
        pruner.join(30)
        hooks.unregister_retention("test-hold")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert getattr(results["first"], "jobs", None) == 1 and not _left(held)


def test_bad_retention_arguments_are_refused_and_change_nothing(redis_clean: None) -> None:
    ids = _finished(1)
    _age(ids)
    for arguments, message in (
        ({"days": -1}, "retention days must be 0"),
        ({"batch_size": 0}, "batch size must be 1-10000"),
        ({"batch_size": 10_001}, "batch size must be 1-10000"),
        ({"batches": 0}, "batches must be at least 1"),
    ):
        with pytest.raises(retention.BadRetention, match=message):
            retention.prune(**arguments)  # type: ignore[arg-type]
    assert _left(ids) == set(ids)
    out = StringIO()
    call_command("koala_prune", "--days", "30", stdout=out)
    assert "pruned 1 jobs, 1 attempts" in out.getvalue() and not _left(ids)
