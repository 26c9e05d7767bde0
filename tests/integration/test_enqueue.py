"""Enqueue against real PostgreSQL and Redis: idempotency, bad input, after-commit doorbell."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from koala.models import AuditEvent
from workers import doorbell
from workers.errors import EnqueueError, UnknownName
from workers.models import Job
from workers.services.jobs import JobSpec, enqueue, enqueue_many

# Plain django_db: enqueue is the only writer here, and its doorbell is an on_commit callback,
# which django_capture_on_commit_callbacks runs (or shows was never registered) without a commit.
pytestmark = pytest.mark.django_db


def pending_messages(queue: str = "default") -> int:
    return doorbell.rq_queue(queue).count


def test_enqueue_creates_job_and_rings_after_commit(redis_clean: None, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True) as rings:
        with transaction.atomic():
            result = enqueue(kind="noop", input={"n": 1})
            # Nothing rings before commit: a worker must never look before the row exists.
            assert pending_messages() == 0
        assert pending_messages() == 0  # the outer transaction (the test's) has not committed either
    assert len(rings) == 1
    assert result.created
    job = Job.objects.get(pk=result.job_id)
    assert (job.kind, job.version, job.state, job.attempts, job.queue) == ("noop", 1, "queued", 0, "default")
    assert pending_messages() == 1
    message = doorbell.rq_queue("default").jobs[0]
    # The message carries the job id and contract version, nothing else.
    assert message.args == (result.job_id, 1)
    assert message.kwargs == {}


# transaction=True: outside any transaction a lone enqueue takes the autocommit path (one
# INSERT … ON CONFLICT, no BEGIN/COMMIT); only a test that really commits runs it.
@pytest.mark.django_db(transaction=True)
def test_same_key_same_input_returns_existing(redis_clean: None) -> None:
    first = enqueue(kind="noop", input={"a": 1}, idempotency_key="k-1")
    second = enqueue(kind="noop", input={"a": 1}, idempotency_key="k-1")
    assert second.job_id == first.job_id
    assert (first.created, second.created) == (True, False)
    assert Job.objects.count() == 1


# transaction=True: outside any transaction a lone enqueue takes the autocommit path (one
# INSERT … ON CONFLICT, no BEGIN/COMMIT); only a test that really commits runs it.
@pytest.mark.django_db(transaction=True)
def test_same_key_other_input_is_an_error_and_changes_nothing(redis_clean: None) -> None:
    first = enqueue(kind="noop", input={"a": 1}, idempotency_key="k-2")
    before = list(Job.objects.values())
    with pytest.raises(EnqueueError, match=r"already used .* different input"):
        enqueue(kind="noop", input={"a": 2}, idempotency_key="k-2")
    assert list(Job.objects.values()) == before
    assert Job.objects.get(pk=first.job_id).input == {"a": 1}


def test_key_is_unique_per_kind_not_global(redis_clean: None) -> None:
    a = enqueue(kind="noop", input={}, idempotency_key="shared")
    b = enqueue(kind="sleep", input={"seconds": 0}, idempotency_key="shared")
    assert a.job_id != b.job_id


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (JobSpec(kind="no-such-kind"), "unknown job kind"),
        (JobSpec(kind="sleep", input={}), "missing required field"),
        (JobSpec(kind="sleep", input={"seconds": "soon"}), "invalid"),
        (JobSpec(kind="noop", input=["not", "an", "object"]), "must be a JSON object"),  # type: ignore[arg-type]
        (JobSpec(kind="noop", input={"blob": "x" * 20_000}), "Pass references"),
        (JobSpec(kind="noop", version=99), "has no version 99"),
        (JobSpec(kind="noop", idempotency_key=" "), "idempotency_key"),
        (JobSpec(kind="noop", delay_seconds=-1), "negative"),
        # A queue no worker serves, and values PostgreSQL cannot store, are refused here too (the
        # admin, the API and code all enqueue through this service, not only the command line).
        (JobSpec(kind="noop", queue="nope"), "unknown queue 'nope'"),
        (JobSpec(kind="noop", queue=""), "unknown queue ''"),
        (JobSpec(kind="noop", delay_seconds=float("nan")), "delay_seconds must be a finite number"),
        (JobSpec(kind="noop", delay_seconds=float("inf")), "delay_seconds must be a finite number"),
        (JobSpec(kind="noop", delay_seconds=1e12), "delay_seconds must be a finite number"),
        (JobSpec(kind="noop", input={"memo": "a\x00b"}), r"input\.memo contains a NUL character"),
        (JobSpec(kind="noop", input={"a\x00": 1}), "contains a NUL character"),
        (JobSpec(kind="noop", input={"memo": ["\udcff"]}), r"input\.memo\[0\] is not valid UTF-8"),
        (JobSpec(kind="noop", input={"ratio": float("nan")}), r"input\.ratio is not a finite number"),
        (JobSpec(kind="noop", idempotency_key="k\x00"), "idempotency_key contains a NUL character"),
        (JobSpec(kind="noop", correlation_id="c" * 65), "correlation_id"),
        # Budgets and pauses hold a job by the tenant its input names: a name, or nothing.
        (JobSpec(kind="noop", input={"tenant": 42}), r"input\.tenant names the job's tenant .*not int"),
        (JobSpec(kind="noop", input={"tenant": ["acme"]}), r"input\.tenant names the job's tenant .*not list"),
    ],
)
def test_bad_input_is_a_clear_error_and_no_row_changes(redis_clean: None, spec: JobSpec, message: str) -> None:
    existing = enqueue(kind="noop", input={"keep": True}, idempotency_key="keep")
    before = list(Job.objects.values())
    with pytest.raises(EnqueueError, match=message):
        enqueue_many(specs=[JobSpec(kind="noop", input={"n": 1}), spec])
    # The whole batch is refused: the valid first spec was not inserted either.
    assert list(Job.objects.values()) == before
    assert Job.objects.get(pk=existing.job_id).input == {"keep": True}


def test_enqueue_many_batches_and_bounds_doorbell(redis_clean: None, settings, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_DOORBELL_DEPTH = 3
    with django_capture_on_commit_callbacks(execute=True) as rings:
        results = enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(50)])
    assert len(rings) == 1  # one ring for the batch
    assert len({r.job_id for r in results}) == 50
    assert [r.job_id for r in results] == sorted(r.job_id for r in results)
    assert Job.objects.filter(state="queued").count() == 50
    # Redis holds a bounded doorbell, not one message per job.
    assert pending_messages() == 3


def test_rolled_back_enqueue_leaves_nothing(redis_clean: None, django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    with django_capture_on_commit_callbacks(execute=True) as rings:
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue(kind="noop", input={})
            raise RuntimeError("caller's transaction fails")
    assert rings == []  # the rollback took the doorbell with it
    assert Job.objects.count() == 0
    assert pending_messages() == 0


def test_known_queue_override_and_astral_text_are_stored(redis_clean: None) -> None:
    job = Job.objects.get(pk=enqueue(kind="noop", input={"memo": "koala \U0001f428"}, queue="bulk").job_id)
    assert (job.queue, job.input) == ("bulk", {"memo": "koala \U0001f428"})


def test_an_unknown_name_is_a_typed_error(redis_clean: None) -> None:
    with pytest.raises(UnknownName) as refused:
        enqueue(kind="noop", queue="nope")
    assert (refused.value.what, refused.value.name) == ("queue", "nope")
    with pytest.raises(UnknownName) as refused:
        enqueue(kind="nope")
    assert (refused.value.what, refused.value.name) == ("kind", "nope")
    assert not Job.objects.exists()


def test_enqueue_by_a_person_is_audited(redis_clean: None) -> None:
    result = enqueue(kind="noop", input={}, created_by="alice")
    event = AuditEvent.objects.get(action="enqueue")
    assert event.actor == "alice"
    assert str(result.job_id) in event.target_id


def test_enqueue_survives_redis_being_down(settings) -> None:  # type: ignore[no-untyped-def]
    # Redis is a doorbell: with it unreachable the job is still durably queued.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    doorbell.reset_connection()
    try:
        result = enqueue(kind="noop", input={})
    finally:
        doorbell.reset_connection()
    assert Job.objects.get(pk=result.job_id).state == "queued"


def test_a_large_batch_by_a_person_is_audited_with_every_id(redis_clean: None) -> None:
    # Ids past six digits once overflowed the audit row's short target column.
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_value FROM workers_job_id_seq")
        (before,) = cursor.fetchone()
        cursor.execute("SELECT setval('workers_job_id_seq', 9000000)")
    try:
        results = enqueue_many(specs=[JobSpec(kind="noop", input={"n": n}) for n in range(30)], created_by="alice")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval('workers_job_id_seq', %s)", [before])
    event = AuditEvent.objects.get(action="enqueue")
    assert event.target_id == str(results[0].job_id)
    assert event.details["job_ids"] == [r.job_id for r in results] and event.details["count"] == 30


def test_retrying_a_job_whose_queue_is_no_longer_configured_is_refused_as_a_state_error(redis_clean: None) -> None:
    """Operators retry through the console, the admin and koala_retry: all handle JobStateError."""
    from django.utils import timezone

    from workers.errors import JobStateError
    from workers.services.jobs import retry_job

    job_id = enqueue(kind="noop", input={}).job_id
    Job.objects.filter(pk=job_id).update(queue="retired", state="failed", failure_reason="fatal", finished_at=timezone.now())
    with pytest.raises(JobStateError, match=f"job {job_id} cannot be retried: unknown queue 'retired'"):
        retry_job(job_id=job_id, actor="ops")
    assert Job.objects.count() == 1
