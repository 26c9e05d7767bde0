"""Batch claims (docs/engine.md, "Batch claims"): several jobs claimed in one statement, their
completions written in one statement that fences every row by its own lease token."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from django.db import connection

from tests.inprocess import drain
from traces.models import Span
from workers import hooks, outcomes
from workers.errors import Rejection
from workers.hooks import Transition
from workers.models import Attempt, Job
from workers.services import leases
from workers.services.jobs import JobSpec, enqueue_many
from workers.transitions import Ending, end_attempts

pytestmark = pytest.mark.django_db(transaction=True)

SERVED = ["noop@1", "probe@1", "probe_once@1"]


def _claim(count: int, *, batchable: bool = True) -> list[leases.Lease]:
    return leases.claim_next_many(
        queue="default", served=SERVED, worker="batch-test", lease_seconds=30, count=count, batchable=batchable
    )


def test_a_stolen_lease_in_a_batch_refuses_only_that_completion(redis_clean: None) -> None:
    ids = [h.job_id for h in enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(3)])]
    got = _claim(3)
    assert sorted(lease.job_id for lease in got) == sorted(ids)
    stolen = got[1]
    # Someone else owns the job now (the reaper requeued it and another worker claimed it).
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_token = lease_token + 1 WHERE id = %s", [stolen.job_id])
    answers = end_attempts([Ending(outcomes.Complete(result={"n": i}, state_delta={}), lease) for i, lease in enumerate(got)])
    assert answers == [None, Rejection.LEASE_SUPERSEDED, None]
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "state"))
    assert states == {got[0].job_id: "succeeded", stolen.job_id: "running", got[2].job_id: "succeeded"}
    assert Job.objects.get(pk=got[2].job_id).result == {"n": 2}
    assert Attempt.objects.get(job_id=stolen.job_id).outcome is None  # its attempt row untouched
    # A repeat of the batch (its reply was lost): the landed ones answer already_recorded.
    again = end_attempts([Ending(outcomes.Complete(result={"n": i}, state_delta={}), lease) for i, lease in enumerate(got)])
    assert again == [Rejection.ALREADY_RECORDED, Rejection.LEASE_SUPERSEDED, Rejection.ALREADY_RECORDED]


def test_an_expired_lease_in_a_batch_is_refused_alone(redis_clean: None) -> None:
    enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(2)])
    got = _claim(2)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [got[0].job_id])
    answers = end_attempts([Ending(outcomes.Complete(result=None, state_delta={}), lease) for lease in got])
    assert answers == [Rejection.LEASE_EXPIRED, None]
    assert leases.heartbeat_many(held=got, lease_seconds=30) == set()  # neither is held any more


def test_a_batch_claim_takes_only_jobs_that_may_wait(redis_clean: None) -> None:
    """at_most_once jobs and last attempts are never claimed to wait behind others: if the worker
    died before starting them, the reaper would fail them without their body having run."""
    ids = [
        h.job_id
        for h in enqueue_many(
            specs=[
                JobSpec(kind="probe_once", input={"log": "/dev/null"}),
                JobSpec(kind="noop", input={"n": 1}),
                JobSpec(kind="noop", input={"n": 2}),
            ]
        )
    ]
    with connection.cursor() as cursor:  # the second is on its last attempt
        cursor.execute("UPDATE workers_job SET max_attempts = 1 WHERE id = %s", [ids[1]])
    got = _claim(3)
    assert [lease.job_id for lease in got] == [ids[2]]
    rest = _claim(3, batchable=False)  # the HTTP protocol's acquire: every due job
    assert sorted(lease.job_id for lease in rest) == sorted(ids[:2])


def test_a_drain_batches_claims_and_tells_the_hooks_once_per_row(redis_clean: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_CLAIM_BATCH = 8
    told: list[Sequence[Transition]] = []
    hooks.register_on_transition("test-batch", told.append)
    commits: list[int] = []
    try:
        ids = [h.job_id for h in enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(40)])]
        with connection.cursor() as cursor:
            cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
            commits.append(cursor.fetchone()[0])
        assert drain() == 40
    finally:
        hooks.unregister_on_transition("test-batch")
    # Every job's completion told exactly once, and in batches (fewer calls than jobs).
    changes = [change for batch in told for change in batch]
    assert sorted(c.job_id for c in changes) == sorted(ids)
    assert {(c.state, c.outcome, c.cause) for c in changes} == {("succeeded", "succeeded", "attempt")}
    assert len(told) < len(ids) / 3, [len(batch) for batch in told]
    assert max(len(batch) for batch in told) == 8
    # Each job one attempt, succeeded; each attempt exactly one span (the traces app's hook).
    assert set(Job.objects.filter(pk__in=ids).values_list("state", "attempts")) == {("succeeded", 1)}
    assert Attempt.objects.filter(job_id__in=ids, outcome="succeeded").count() == 40
    assert Span.objects.filter(job_id__in=ids, kind="attempt").count() == 40
    assert sorted(Span.objects.filter(job_id__in=ids, kind="attempt").values_list("job_id", flat=True)) == sorted(ids)


def test_a_thin_queue_claims_one_at_a_time(redis_clean: None) -> None:
    [handle] = enqueue_many(specs=[JobSpec(kind="noop", input={})])
    assert drain() == 1
    assert Job.objects.get(pk=handle.job_id).state == "succeeded"


def test_at_most_once_jobs_still_run_between_batches(redis_clean: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = str(tmp_path / "effects.log")
    specs = [JobSpec(kind="noop", input={"n": n}) for n in range(10)]
    specs[3] = JobSpec(kind="probe_once", input={"log": log})
    ids = [h.job_id for h in enqueue_many(specs=specs)]
    assert drain() == 10
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert len([line for line in open(log) if line.startswith("start")]) == 1
