"""The claim by id and a doorbell for a version this worker lacks (rolling deploys)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from workers import doorbell
from workers.models import Attempt, Job, WorkerProcess
from workers.services import leases
from workers.services.jobs import enqueue

# transaction=True: claims compare scheduled_at with PostgreSQL's now(), which stands still
# inside one transaction, so a job enqueued in the test's transaction never falls due there.
pytestmark = pytest.mark.django_db(transaction=True)


def live_worker(name: str, kinds: list[str], *, queues: tuple[str, ...] = ("default",), stopped: bool = False) -> None:
    now = timezone.now()
    WorkerProcess.objects.create(
        name=name,
        hostname="h",
        pid=1,
        queues=list(queues),
        kinds=kinds,
        worker_class="SimpleWorker",
        started_at=now,
        last_seen_at=now,
        stopped_at=now if stopped else None,
    )


def test_a_worker_never_claims_by_id_a_version_it_does_not_serve(redis_clean: None) -> None:
    job_id = enqueue(kind="versioned", version=2, input={}).job_id
    assert leases.claim_job(job_id=job_id, worker="old", lease_seconds=30, served=["versioned@1", "noop@1"]) is None
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.attempts, job.lease_token, job.scheduled_at) == ("queued", 0, 0, job.created_at)
    assert not Attempt.objects.filter(job_id=job_id).exists()
    lease = leases.claim_job(job_id=job_id, worker="new", lease_seconds=30, served=["versioned@2"])
    assert lease is not None and lease.version == 2


def test_misdelivered_counts_the_live_workers_that_can_and_cannot_serve_it(redis_clean: None) -> None:
    job_id = enqueue(kind="versioned", version=2, input={}).job_id
    live_worker("old-a", ["versioned@1"])
    live_worker("old-b", ["versioned@1"])
    live_worker("new", ["versioned@1", "versioned@2"])
    live_worker("gone", ["versioned@2"], stopped=True)  # stopped: not a capable worker
    live_worker("elsewhere", ["versioned@2"], queues=("other",))  # does not listen on the job's queue
    missed = leases.misdelivered(job_id=job_id, served=["versioned@1"], live_seconds=30)
    assert missed == leases.Misdelivery(queue="default", version=2, capable=1, incapable=2)

    # A worker that serves it, or a job no longer queued: not a misdelivery.
    assert leases.misdelivered(job_id=job_id, served=["versioned@2"], live_seconds=30) is None
    # A capable worker not seen for longer than the live window counts for nothing: no pass-on.
    WorkerProcess.objects.filter(name="new").update(last_seen_at=timezone.now() - timedelta(seconds=60))
    stale = leases.misdelivered(job_id=job_id, served=["versioned@1"], live_seconds=30)
    assert stale is not None and (stale.capable, stale.incapable) == (0, 2)
    assert leases.claim_job(job_id=job_id, worker="new", lease_seconds=30, served=["versioned@2"]) is not None
    assert leases.misdelivered(job_id=job_id, served=["versioned@1"], live_seconds=30) is None


@pytest.mark.django_db  # no claim: enqueue's doorbells are on_commit callbacks, run here by the capture
def test_a_passed_on_doorbell_goes_to_the_head_of_the_queue_with_its_hop_count(
    redis_clean: None, django_capture_on_commit_callbacks
) -> None:  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True):
        first = enqueue(kind="noop", input={"n": 1}).job_id
        second = enqueue(kind="noop", input={"n": 2}).job_id
    assert doorbell.pass_on("default", 99, 2, hops=1)
    messages = doorbell.rq_queue("default").jobs
    assert [m.args for m in messages] == [(99, 2), (first, 1), (second, 1)]
    assert (messages[0].meta, messages[1].meta) == ({doorbell.HOPS: 1}, {})
