"""Claim, fencing and the four named rejections, against real PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from workers import outcomes
from workers.errors import Rejection
from workers.models import Attempt, FailureReason, Job, Outcome
from workers.services import leases
from workers.services.jobs import cancel_job, enqueue, requeue_job
from workers.services.leases import Lease
from workers.transitions import Report, end_attempt

# transaction=True: claims compare scheduled_at with PostgreSQL's now(), which stands still
# inside one transaction, so a job enqueued in the test's transaction never falls due there.
pytestmark = pytest.mark.django_db(transaction=True)


def complete(lease: Lease, result: object = None, **delta: object) -> Rejection | None:
    return end_attempt(outcomes.Complete(result=result, state_delta=dict(delta)), lease)


def fail(lease: Lease, message: str = "m") -> Rejection | None:
    return end_attempt(outcomes.Fail(reason=FailureReason.FATAL, error_class="E", message=message), lease)


def expire_lease(job_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_expires_at = now() - interval '1 minute' WHERE id = %s", [job_id])


def test_claim_creates_attempt_and_bumps_token(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w1", lease_seconds=30)
    assert lease is not None
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.lease_token, job.lease_holder, job.attempts) == ("running", 1, "w1", 1)
    attempt = Attempt.objects.get(job_id=job_id)
    assert (attempt.number, attempt.worker_id, attempt.lease_token, attempt.outcome) == (1, "w1", 1, None)
    assert lease.attempt_id == attempt.pk and lease.lease_token == 1


def test_duplicate_delivery_claims_once(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    assert leases.claim_job(job_id=job_id, worker="w1", lease_seconds=30) is not None
    assert leases.claim_job(job_id=job_id, worker="w2", lease_seconds=30) is None
    assert Attempt.objects.filter(job_id=job_id).count() == 1


def test_concurrent_claims_have_a_single_winner(redis_clean: None) -> None:
    ids = [r.job_id for r in [enqueue(kind="noop", input={"n": n}) for n in range(30)]]
    won: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def contender(name: str) -> None:
        barrier.wait()
        try:
            for job_id in ids:
                lease = leases.claim_job(job_id=job_id, worker=name, lease_seconds=30)
                if lease is not None:
                    with lock:
                        won.append(job_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=contender, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == sorted(ids)  # every job claimed exactly once
    assert Attempt.objects.count() == 30


def test_claim_next_respects_priority_schedule_and_served_kinds(redis_clean: None) -> None:
    low = enqueue(kind="noop", input={"p": "low"}).job_id
    high = enqueue(kind="noop", input={"p": "high"}, priority=5).job_id
    enqueue(kind="noop", input={"p": "later"}, priority=9, delay_seconds=60)
    enqueue(kind="sleep", input={"seconds": 0}, priority=10)
    served = ["noop@1"]
    first = leases.claim_next(queue="default", served=served, worker="w", lease_seconds=30)
    second = leases.claim_next(queue="default", served=served, worker="w", lease_seconds=30)
    third = leases.claim_next(queue="default", served=served, worker="w", lease_seconds=30)
    assert first is not None and second is not None
    assert (first.job_id, second.job_id, third) == (high, low, None)


def test_complete_merges_state_by_top_level_key(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    Job.objects.filter(pk=job_id).update(run_state={"keep": 1, "replace": {"old": True}})
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    assert (
        end_attempt(
            outcomes.Complete(result={"ok": 1}, state_delta={"replace": {"new": True}, "add": 2}),
            lease,
            Report(compute_seconds=0.5, usage={"requests": 2}),
        )
        is None
    )
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded" and job.result == {"ok": 1} and job.finished_at is not None
    assert job.run_state == {"keep": 1, "replace": {"new": True}, "add": 2}
    assert job.usage == {"requests": 2}
    assert job.lease_holder is None and job.lease_expires_at is None
    attempt = Attempt.objects.get(job_id=job_id)
    assert attempt.outcome == "succeeded" and attempt.compute_seconds == 0.5


def test_repeat_of_the_same_completion_is_already_recorded(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    assert complete(lease, 1) is None
    assert complete(lease, 1) is Rejection.ALREADY_RECORDED
    # A different report from the same attempt cannot change a terminal job either; its first
    # report stands, so it is told already_recorded (not lease_expired: no reaper decides a
    # finished job).
    rejection = fail(lease, "late")
    assert rejection is Rejection.ALREADY_RECORDED
    assert Job.objects.get(pk=job_id).state == "succeeded"


def test_expired_lease_is_rejected_by_name(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    expire_lease(job_id)
    assert leases.heartbeat(job_id=job_id, lease_token=lease.lease_token, lease_seconds=30) is Rejection.LEASE_EXPIRED
    assert complete(lease, 1) is Rejection.LEASE_EXPIRED
    assert Job.objects.get(pk=job_id).state == "running"  # unchanged: the reaper decides


def test_superseded_attempt_cannot_change_the_outcome(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    stale = leases.claim_job(job_id=job_id, worker="old", lease_seconds=30)
    assert stale is not None
    requeue_job(job_id=job_id, actor="ops")  # takes the job away from a stuck holder
    fresh = leases.claim_job(job_id=job_id, worker="new", lease_seconds=30)
    assert fresh is not None and fresh.lease_token == stale.lease_token + 1
    for call in (
        lambda: leases.heartbeat(job_id=job_id, lease_token=stale.lease_token, lease_seconds=30, progress={"x": 1}),
        lambda: complete(stale, "stale"),
        lambda: fail(stale),
        lambda: end_attempt(outcomes.RetryLater(delay_seconds=1, error_class="E", message="m"), stale),
    ):
        assert call() is Rejection.LEASE_SUPERSEDED
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.lease_holder, job.progress) == ("running", "new", {})
    assert complete(fresh, "fresh") is None
    assert Job.objects.get(pk=job_id).result == "fresh"


def test_cancelled_job_rejects_its_running_attempt(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    cancel_job(job_id=job_id, actor="ops", reason="wrong customer")
    assert leases.heartbeat(job_id=job_id, lease_token=lease.lease_token, lease_seconds=30) is Rejection.JOB_CANCELLED
    assert complete(lease, 1) is Rejection.JOB_CANCELLED
    job = Job.objects.get(pk=job_id)
    assert job.state == "cancelled" and job.result is None
    assert Attempt.objects.get(job_id=job_id).outcome == "cancelled"


def test_release_gives_the_attempt_back(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    assert end_attempt(outcomes.Release(outcome=Outcome.INTERRUPTED, message=""), lease) is None
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts) == ("queued", 0)
    again = leases.claim_job(job_id=job_id, worker="w2", lease_seconds=30)
    assert again is not None and again.attempts == 1
    assert list(Attempt.objects.filter(job_id=job_id).values_list("number", "outcome")) == [(1, "interrupted"), (2, None)]


@pytest.mark.django_db  # the constraints answer inside the test's transaction
def test_database_refuses_states_outside_the_closed_set(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job_id).update(state="paused-ish")
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job_id).update(state="running")  # running without a lease
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job_id).update(state="failed")  # failed without a reason
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job_id).update(attempts=99)


def test_database_allows_one_live_attempt_per_job(redis_clean: None) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    assert lease is not None
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, usage, error_class, error_message) "
            "VALUES (%s, 2, 'intruder', 99, now(), '{}', '', '')",
            [job_id],
        )
