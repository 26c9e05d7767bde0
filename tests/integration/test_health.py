"""/healthz, /readyz and koala_status against real PostgreSQL and Redis rows."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devtools.sandbox.provider import FakeProvider
from reviews.models import ReviewRequest
from tests.integration.test_console_reads_write_nothing import writes
from tests.support.console_scenarios import pending_review
from tests.support.fleet import free_port
from workers import doorbell
from workers.models import BeatTask, BudgetUsage, Job, WorkerProcess
from workers.selectors.budgets import local_day
from workers.selectors.health import _leaf_migrations
from workers.services.budgets import create_budget
from workers.services.jobs import enqueue
from workers.services.maintenance import beat_tick as engine_beat_tick

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="localhost")


def beat_tick() -> None:
    """One real tick of the beat: every step records its row (the beat is ticking)."""
    engine_beat_tick(prune_due=True, interval_seconds=1.0)


def status(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("koala_status", *args, stdout=out)
    except CommandError as error:
        return error.returncode, out.getvalue()
    return 0, out.getvalue()


def lines(output: str) -> dict[str, str]:
    """check name -> its level, from the text lines."""
    return {line.split()[1]: line.split()[0] for line in output.splitlines()}


# -- /healthz and /readyz ----------------------------------------------------------------------------


def test_healthz_answers_without_the_database(client: Client) -> None:
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")
    assert captured.captured_queries == []
    assert response["Cache-Control"].startswith("max-age=0")
    assert client.post("/healthz").status_code == 405


def test_readyz_is_ready_and_says_only_one_word_per_check(client: Client, redis_clean: None) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.content == b"database ok\nredis ok\nmigrations ok\n"
    assert "Set-Cookie" not in response


@pytest.fixture
def closed_redis(settings: Any) -> Iterator[None]:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/4"  # nothing listens there
    doorbell.reset_connection()
    yield
    doorbell.reset_connection()


def test_readyz_is_503_when_redis_is_unreachable(client: Client, closed_redis: None) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.content == b"database ok\nredis failed\nmigrations ok\n"  # no host, port or error text
    assert client.get("/healthz").status_code == 200


def test_readyz_is_503_while_a_migration_is_unapplied(client: Client, redis_clean: None) -> None:
    recorder = MigrationRecorder(connection)
    app, name = sorted(_leaf_migrations())[0]
    recorder.record_unapplied(app, name)
    try:
        response = client.get("/readyz")
    finally:
        recorder.record_applied(app, name)
    assert response.status_code == 503
    assert response.content == b"database ok\nredis ok\nmigrations failed\n"
    assert client.get("/readyz").status_code == 200


# -- koala_status --------------------------------------------------------------------------------------


def test_status_ok_after_a_beat_tick_with_nothing_due(redis_clean: None) -> None:
    beat_tick()
    code, output = status()
    assert code == 0, output
    assert set(lines(output).values()) == {"OK"}
    assert {"due_age", "last_completion", "workers", "breaker", "budgets", "beat", "reviews"} <= set(lines(output))


def test_status_warns_on_an_old_due_job_and_a_waiting_review(provider: FakeProvider, redis_clean: None) -> None:
    beat_tick()
    job = enqueue(kind="noop", input={}, queue="bulk")
    Job.objects.filter(pk=job.job_id).update(scheduled_at=timezone.now() - dt.timedelta(minutes=10))
    review = pending_review(requested_by="someone-else")
    ReviewRequest.objects.filter(pk=review.pk).update(created_at=timezone.now() - dt.timedelta(hours=2))
    code, output = status()
    assert code == 1, output
    found = lines(output)
    assert found["due_age:bulk"] == "WARNING" and found["reviews"] == "WARNING"
    assert found["last_completion"] == "WARNING"  # work due and no success on record
    assert "1 pending, oldest waited 7" in output  # 7200 s
    document = json.loads(status("--json")[1])
    assert document["status"] == "warning"
    assert {c["name"]: c["level"] for c in document["checks"]}["due_age:bulk"] == "warning"


def test_status_is_critical_for_a_stuck_worker_an_exhausted_budget_and_a_stale_beat(redis_clean: None) -> None:
    now = timezone.now()
    beat_tick()
    BeatTask.objects.filter(name="reap").update(last_succeeded_at=now - dt.timedelta(hours=1))
    budget = create_budget(name="daily", scope="global", spend_limit_minor=1000, actor="setup")
    BudgetUsage.objects.create(budget=budget, period=local_day(budget, now), spent_minor=1000)
    job = enqueue(kind="noop", input={})
    Job.objects.filter(pk=job.job_id).update(scheduled_at=now - dt.timedelta(minutes=20))
    WorkerProcess.objects.create(
        name="w1",
        hostname="h1",
        pid=101,
        queues=["default"],
        worker_class="KoalaSimpleWorker",
        started_at=now - dt.timedelta(hours=1),
        last_seen_at=now,
    )
    code, output = status()
    assert code == 2, output
    found = lines(output)
    assert found["workers"] == "CRITICAL" and "stuck: w1" in output
    assert found["budget:daily"] == "CRITICAL" and "spend exhausted (1000/1000)" in output
    assert found["beat"] == "CRITICAL" and "reap" in output
    assert found["due_age:default"] == "WARNING"  # 20 min: past 300 s, short of 1800 s


def test_status_thresholds_come_from_settings(settings: Any, redis_clean: None) -> None:
    beat_tick()
    job = enqueue(kind="noop", input={}, queue="bulk")
    Job.objects.filter(pk=job.job_id).update(scheduled_at=timezone.now() - dt.timedelta(minutes=10))
    settings.KOALA_STATUS_DUE_AGE_CRITICAL_SECONDS = 60
    assert lines(status()[1])["due_age:bulk"] == "CRITICAL"


def test_status_refuses_an_unknown_option_and_writes_nothing(provider: FakeProvider, redis_clean: None) -> None:
    beat_tick()
    with pytest.raises(CommandError, match="unrecognized arguments: --bogus"):
        call_command("koala_status", "--bogus", stdout=io.StringIO())
    enqueue(kind="noop", input={}, queue="bulk")
    pending_review(requested_by="someone-else")
    with CaptureQueriesContext(connection) as captured:
        status()
        status("--json")
    assert writes(captured) == []
