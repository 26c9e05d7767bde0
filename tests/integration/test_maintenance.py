"""Reaper and dispatcher, from database state alone."""

from __future__ import annotations

import pytest
from django.db import connection

from workers import doorbell
from workers.models import Attempt, Job
from workers.services import leases
from workers.services.jobs import JobSpec, enqueue, enqueue_many
from workers.services.maintenance import dispatch, reap

# transaction=True: claims compare scheduled_at with PostgreSQL's now(), which stands still
# inside one transaction, so a job enqueued in the test's transaction never falls due there.
pytestmark = pytest.mark.django_db(transaction=True)


def expire(job_id: int, seconds_ago: int = 60) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workers_job SET lease_expires_at = now() - make_interval(secs => %s) WHERE id = %s", [seconds_ago, job_id]
        )


def test_reaper_requeues_at_least_once_after_grace(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="dead", lease_seconds=30)
    assert lease is not None
    expire(job_id, seconds_ago=1)
    report = reap(grace_seconds=30)  # expired, but still inside the grace period
    assert (report.orphaned, report.requeued) == (1, 0)
    assert Job.objects.get(pk=job_id).state == "running"
    assert Attempt.objects.get(job_id=job_id).outcome == "orphaned"
    expire(job_id, seconds_ago=60)
    doorbell.redis_connection().flushdb()  # forget enqueue's own doorbell: the next one is the reaper's
    report = reap(grace_seconds=30)
    assert (report.orphaned, report.requeued) == (0, 1)
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts, job.lease_holder) == ("queued", 1, None)
    assert [m.args for m in doorbell.rq_queue("default").jobs] == [(job_id, 1)]  # rung again for a worker


def test_reaper_fails_at_most_once_with_orphan_reason(redis_clean: None) -> None:
    job_id = enqueue(kind="probe_once", input={"log": "/dev/null"}).job_id
    lease = leases.claim_job(job_id=job_id, worker="dead", lease_seconds=30)
    assert lease is not None
    expire(job_id)
    report = reap(grace_seconds=0)
    assert report.failed == 1
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason) == ("failed", "orphaned")
    assert "at_most_once" in job.error_message


def test_reaper_fails_when_attempts_are_spent(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    Job.objects.filter(pk=job_id).update(attempts=2)  # max_attempts is 3: this claim is the last
    lease = leases.claim_job(job_id=job_id, worker="dead", lease_seconds=30)
    assert lease is not None
    expire(job_id)
    reap(grace_seconds=0)
    assert Job.objects.get(pk=job_id).failure_reason == "orphaned"


def test_reaper_fails_queued_jobs_past_their_deadline(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET deadline_at = now() - interval '1 second' WHERE id = %s", [job_id])
    assert reap().deadline_failed == 1
    assert Job.objects.get(pk=job_id).failure_reason == "deadline_exceeded"


def test_reaper_leaves_live_leases_alone(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    assert leases.claim_job(job_id=job_id, worker="alive", lease_seconds=30) is not None
    assert reap(grace_seconds=0) == type(reap())(0, 0, 0, 0)
    assert Job.objects.get(pk=job_id).state == "running"


def test_dispatcher_rerings_after_redis_loses_everything(redis_clean: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_DOORBELL_DEPTH = 4
    enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(10)])
    enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}, queue="bulk") for n in range(3)])
    enqueue(kind="noop", input={"later": True}, queue="critical", delay_seconds=600)
    doorbell.redis_connection().flushdb()  # the same loss as FLUSHALL, scoped to this test's database
    assert dispatch() == 4 + 3
    assert doorbell.rq_queue("default").count == 4
    assert doorbell.rq_queue("bulk").count == 3
    assert doorbell.rq_queue("critical").count == 0  # not due yet
    # Already rung: a second tick adds nothing while messages are pending.
    assert dispatch() == 0
