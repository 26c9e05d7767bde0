"""The runtime in this process (main thread, so time limits use real SIGALRM) on real services."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import datetime

import pytest
from django.db import connection
from django.utils import timezone

from tests.conftest import wait_for
from tests.inprocess import drain, drain_until, run_until
from workers import kinds
from workers.models import Attempt, Job
from workers.runtime import get_runtime
from workers.services.jobs import cancel_job, enqueue

# transaction=True: bodies run through the real runtime, whose claims need committed rows (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def test_success_records_result_state_and_timing(redis_clean: None) -> None:
    job_id = enqueue(kind="sleep", input={"seconds": 0.2}).job_id
    assert drain() == 1
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.result, job.run_state) == ("succeeded", {"slept": 0.2}, {"slept": 0.2})
    attempt = Attempt.objects.get(job_id=job_id)
    assert attempt.outcome == "succeeded"
    assert attempt.compute_seconds is not None and attempt.compute_seconds >= 0.2
    assert attempt.worker_id == get_runtime().name


def test_retryable_backs_off_with_full_jitter_and_stops_at_max(redis_clean: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_DRAIN_BATCH = 1  # one attempt per pass: each retry's due time is read before the next claim
    kind = kinds.get("transient", 1)
    assert kind is not None
    job_id = enqueue(kind="transient", input={}).job_id
    due: dict[int, datetime] = {}  # attempt number -> the scheduled_at its retry was given

    def finished() -> Job | None:
        job = Job.objects.get(pk=job_id)
        if job.state == "queued":
            due[job.attempts + 1] = job.scheduled_at
        return job if job.is_terminal else None

    job = drain_until(finished, what=f"job {job_id} to finish")
    assert (job.state, job.failure_reason, job.attempts) == ("failed", "attempts_exhausted", kind.max_attempts)
    attempts = list(Attempt.objects.filter(job_id=job_id).order_by("number"))
    assert [a.outcome for a in attempts] == ["retry"] * (kind.max_attempts - 1) + ["failed"]
    assert sorted(due) == [a.number for a in attempts[1:]]
    for earlier, later in itertools.pairwise(attempts):
        assert earlier.finished_at is not None
        # Never claimed before its backoff ran out (both times are PostgreSQL's clock)...
        assert later.started_at >= due[later.number], (later.number, later.started_at, due[later.number])
        # ...and re-drained promptly once due; the window itself is checked on scheduled_at below.
        ceiling = min(kind.backoff_cap, kind.backoff_base * 2 ** (earlier.number - 1))
        assert (later.started_at - earlier.finished_at).total_seconds() <= ceiling + 0.5
    assert "503" in job.error_message


def test_backoff_delays_stay_inside_the_full_jitter_window(redis_clean: None) -> None:
    kind = kinds.get("transient", 1)
    assert kind is not None
    samples = {n: [kind.backoff_seconds(n) for _ in range(500)] for n in range(1, 8)}
    for n, values in samples.items():
        ceiling = min(kind.backoff_cap, kind.backoff_base * 2 ** (n - 1))
        assert all(0 <= v <= ceiling for v in values)
        assert max(values) > ceiling * 0.8  # really spread over the window, not a constant
        assert min(values) < ceiling * 0.2


def test_retry_is_scheduled_inside_the_window(redis_clean: None) -> None:
    kind = kinds.get("transient", 1)
    assert kind is not None
    job_id = enqueue(kind="transient", input={}).job_id
    runtime = get_runtime()
    from workers.services import leases

    lease = leases.claim_job(job_id=job_id, worker=runtime.name, lease_seconds=30)
    assert lease is not None
    runtime.run(lease)
    job = Job.objects.get(pk=job_id)
    attempt = Attempt.objects.get(job_id=job_id)
    assert job.state == "queued" and attempt.outcome == "retry"
    assert attempt.finished_at is not None
    delay = (job.scheduled_at - attempt.finished_at).total_seconds()
    assert -0.05 <= delay <= min(kind.backoff_cap, kind.backoff_base) + 0.05


def test_terminal_failure_does_not_retry(redis_clean: None) -> None:
    job_id = enqueue(kind="terminal", input={}).job_id
    drain()
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason, job.attempts) == ("failed", "terminal", 1)
    assert job.error_class == "TerminalFailure:unauthorized"
    assert Attempt.objects.filter(job_id=job_id).count() == 1


def test_unknown_errors_are_fatal_and_secrets_never_stored(redis_clean: None) -> None:
    card, bearer = "4242424242424242", "tok_live_abcdefghijklmnop"
    job_id = enqueue(kind="boom", input={"card": card, "bearer": bearer}).job_id
    drain()
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason, job.attempts, job.error_class) == ("failed", "fatal", 1, "ValueError")
    assert "charge failed" in job.error_message
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.error_message || a.error_message || a.error_class || j.error_class "
            "FROM workers_job j JOIN workers_attempt a ON a.job_id = j.id WHERE j.id = %s",
            [job_id],
        )
        stored = cursor.fetchone()[0]
    assert card not in stored and bearer not in stored
    assert "Traceback" not in stored and 'File "' not in stored


def test_attempt_time_limit_interrupts_an_uncooperative_body(redis_clean: None) -> None:
    job_id = enqueue(kind="slow_uncooperative", input={"seconds": 30}).job_id
    started = time.monotonic()
    job = run_until(job_id)
    assert time.monotonic() - started < 5
    assert (job.state, job.failure_reason, job.attempts) == ("failed", "attempts_exhausted", 2)
    assert list(Attempt.objects.filter(job_id=job_id).values_list("error_class", flat=True)) == ["AttemptTimeout"] * 2


def test_operator_cancel_reaches_the_body_at_the_next_heartbeat(redis_clean: None, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_HEARTBEAT_SECONDS = 0.1
    job_id = enqueue(kind="sleep", input={"seconds": 20}).job_id

    def cancel_soon() -> None:
        try:
            # Once the body runs (the claim is committed), not after a guessed while.
            wait_for(lambda: Job.objects.filter(pk=job_id, state="running").exists(), timeout=10, what="the body to start")
            cancel_job(job_id=job_id, actor="ops", reason="customer asked")
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_soon)
    canceller.start()
    started = time.monotonic()
    drain()
    canceller.join()
    assert time.monotonic() - started < 5  # stopped at a heartbeat, not after 20 s
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.result) == ("cancelled", None)
    assert Attempt.objects.get(job_id=job_id).outcome == "cancelled"


def test_unservable_job_is_released_with_growing_backoff(redis_clean: None) -> None:
    from workers.services import leases

    job_id = enqueue(kind="versioned", version=2, input={}).job_id
    v2 = kinds.get("versioned", 2)
    assert v2 is not None
    kinds.unregister("versioned", 2)  # this process now plays an old worker without v2
    try:
        delays = []
        for _ in range(3):
            Job.objects.filter(pk=job_id).update(scheduled_at=timezone.now())
            # Workers never claim a job they do not serve; a lease for one can still reach this
            # path (claimed for a worker with a different registry), and run() hands it back.
            lease = leases.claim_job(job_id=job_id, worker="old", lease_seconds=30, served=["versioned@2"])
            assert lease is not None
            get_runtime().run(lease)
            job = Job.objects.get(pk=job_id)
            last = Attempt.objects.filter(job_id=job_id).order_by("-number")[0]
            assert (job.state, job.attempts, last.outcome) == ("queued", 0, "unservable")
            assert last.finished_at is not None
            delays.append((job.scheduled_at - last.finished_at).total_seconds())
    finally:
        kinds.register(v2)
    assert [round(d, 1) for d in delays] == [0.5, 1.0, 2.0]
