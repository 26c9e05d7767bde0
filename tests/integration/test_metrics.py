"""GET /metrics against real PostgreSQL rows: every family of the contract (docs/metrics.md) with
the value the rows say, the auth, the counters through a fold and through pruning, and two folds
at once never counting a row twice."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from devtools.sandbox.provider import FakeProvider
from metrics import services
from metrics.models import CompletionTally, FoldMark
from schedules.models import Schedule
from tests.inprocess import drain_until, run_until
from tests.support.console_scenarios import pending_review
from workers.models import Attempt, BeatTask, BudgetUsage, Job, Operation, WorkerProcess
from workers.services import leases, retention
from workers.services.budgets import create_budget
from workers.services.jobs import JobSpec, enqueue, enqueue_many
from workers.services.pauses import trip_breakers

pytestmark = pytest.mark.django_db(transaction=True)  # bodies are claimed: committed rows

Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


@pytest.fixture(autouse=True)
def _no_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fold stays this far behind the oldest open transaction; a test's rows are seconds old.
    monkeypatch.setattr(services, "HORIZON_MARGIN_SECONDS", 0.0)


@pytest.fixture
def client() -> Client:
    return Client(HTTP_HOST="localhost")  # REMOTE_ADDR 127.0.0.1: loopback, no token configured


def scrape(client: Client, **headers: str) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    out: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the series of ``name`` whose labels include ``labels``."""
    return sum(v for key, v in samples.get(name, {}).items() if set(labels.items()) <= set(key))


def _succeeded(count: int, key: str = "") -> list[int]:
    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={"i": i, "k": key}) for i in range(count)])]
    drain_until(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == count, what="the jobs to finish")
    return ids


@pytest.fixture
def rows(provider: FakeProvider, redis_clean: None) -> Iterator[dict[str, Any]]:
    """A small world: finished, failed, queued, parked, orphaned work, a budget, a review, a breaker,
    workers, the beat and a schedule."""
    now = timezone.now()
    made: dict[str, Any] = {"succeeded": _succeeded(3)}
    made["terminal"] = run_until(enqueue(kind="terminal", input={}).job_id).pk  # failed: terminal
    made["boom"] = run_until(enqueue(kind="boom", input={}).job_id).pk  # failed: fatal
    made["review"] = pending_review(requested_by="someone-else")  # parked waiting_review
    made["later"] = enqueue(kind="noop", input={"later": 1}, delay_seconds=3600).job_id  # queued, not due
    due = enqueue(kind="noop", input={"due": 1}, queue="bulk").job_id
    Job.objects.filter(pk=due).update(scheduled_at=now - dt.timedelta(seconds=120))  # due for two minutes
    made["due"] = due
    running = enqueue(kind="noop", input={"orphan": 1}, queue="exports").job_id
    orphan = leases.claim_next(queue="exports", served=["noop@1"], worker="w-gone", lease_seconds=60)
    assert orphan is not None and orphan.job_id == running
    Job.objects.filter(pk=running).update(lease_expires_at=now - dt.timedelta(seconds=5))
    made["orphan"] = orphan
    budget = create_budget(
        name="daily", scope="global", actor="setup", spend_limit_minor=1000, request_limit=10, concurrency_limit=4
    )
    BudgetUsage.objects.update_or_create(
        budget=budget, period=timezone.localdate(now), defaults={"spent_minor": 700, "reserved_minor": 100, "requests": 5}
    )
    assert trip_breakers(threshold=1)  # boom's last attempt failed fatally: its kind is paused
    WorkerProcess.objects.create(
        name="w-live", hostname="h", pid=1, queues=["critical"], worker_class="t", started_at=now, last_seen_at=now
    )
    BeatTask.objects.create(name="reap", beat="h:1", last_started_at=now, last_finished_at=now, last_succeeded_at=now)
    Schedule.objects.create(
        name="nightly",
        kind="noop",
        interval_seconds=86400,
        zone="UTC",
        anchor_at=now,
        last_slot_at=now - dt.timedelta(days=1),
        next_slot_at=now + dt.timedelta(hours=3),
    )
    made["now"] = now
    yield made


def test_every_family_of_the_contract_says_what_the_rows_say(client: Client, rows: dict[str, Any]) -> None:
    # Rejections: a heartbeat with a stale token (the engine's fence) and an API call refused in
    # async code (counted in this process, written by the next scrape here).
    assert leases.heartbeat(job_id=rows["orphan"].job_id, lease_token=rows["orphan"].lease_token + 7, lease_seconds=30)
    assert client.get("/api/v1/workers/register").status_code == 405

    got = scrape(client)

    attempts = Attempt.objects.exclude(outcome=None)
    # Jobs by queue and state, due, the oldest due age, parked by reason.
    assert value(got, "koala_jobs", queue="default", state="succeeded") == 3
    assert value(got, "koala_jobs", queue="default", state="failed") == 2
    assert value(got, "koala_jobs", queue="default", state="queued") == 1
    assert value(got, "koala_jobs", queue="bulk", state="queued") == 1
    assert value(got, "koala_jobs", queue="exports", state="running") == 1
    assert value(got, "koala_jobs", queue="default", state="parked") == 1
    assert value(got, "koala_jobs_due", queue="bulk") == 1
    assert value(got, "koala_jobs_due", queue="default") == 0
    assert 120 <= value(got, "koala_queue_oldest_due_age_seconds", queue="bulk") < 180
    assert value(got, "koala_queue_oldest_due_age_seconds", queue="default") == 0
    assert value(got, "koala_jobs_parked", queue="default", reason="waiting_review") == 1
    assert value(got, "koala_jobs_parked", queue="default", reason="budget") == 0
    # Completions by outcome; failures by reason; durations of every attempt that ran.
    for (queue, kind, outcome), n in _by(attempts, "job__queue", "job__kind", "outcome").items():
        assert value(got, "koala_job_completions_total", queue=queue, kind=kind, outcome=outcome) == n
    assert value(got, "koala_job_completions_total", queue="default", kind="noop", outcome="succeeded") == 3
    assert value(got, "koala_job_failures_total", queue="default", kind="terminal", reason="terminal") == 1
    assert value(got, "koala_job_failures_total", queue="default", kind="boom", reason="fatal") == 1
    assert value(got, "koala_attempt_duration_seconds_count", kind="noop", part="total") == 3
    assert value(got, "koala_attempt_duration_seconds_bucket", kind="noop", part="total", le="+Inf") == 3
    assert value(got, "koala_attempt_duration_seconds_bucket", kind="noop", part="total", le="14400.0") == 3
    assert 0 < value(got, "koala_attempt_duration_seconds_sum", kind="noop", part="total") < 60
    assert value(got, "koala_attempt_duration_seconds_count", kind="noop", part="compute") == 3
    # Named rejections.
    assert value(got, "koala_rejections_total", reason="lease_superseded") == 1
    assert value(got, "koala_rejections_total", reason="api_method_not_allowed") == 1
    assert value(got, "koala_orphaned_leases") == 1
    # Budgets: spend (used + reserved) in its currency, requests, concurrency (running jobs).
    assert value(got, "koala_budget_used", budget="daily", resource="spend", currency="EUR") == 800
    assert value(got, "koala_budget_limit", budget="daily", resource="spend", currency="EUR") == 1000
    assert value(got, "koala_budget_used_ratio", budget="daily", resource="spend") == 0.8
    assert value(got, "koala_budget_used", budget="daily", resource="requests", currency="") == 5
    assert value(got, "koala_budget_used_ratio", budget="daily", resource="requests") == 0.5
    assert value(got, "koala_budget_used", budget="daily", resource="concurrency", currency="") == 1
    assert value(got, "koala_budget_limit", budget="daily", resource="concurrency", currency="") == 4
    # Reviews, operations needing a person, workers, last ends.
    assert value(got, "koala_reviews_pending") == 1
    assert 0 <= value(got, "koala_review_oldest_age_seconds") < 120
    assert (
        value(got, "koala_operations_attention")
        == Operation.objects.filter(state__in=["in_flight", "uncertain"], job__park_reason="needs_attention").count()
    )
    assert value(got, "koala_workers", state="idle") + value(got, "koala_workers", state="healthy") >= 1
    assert {key[0][1] for key in got["koala_workers"]} >= {"healthy", "idle", "stuck", "crash_looping", "lost"}
    newest = max(a.finished_at for a in attempts)
    assert value(got, "koala_last_attempt_completed_timestamp_seconds") == pytest.approx(newest.timestamp(), abs=1e-3)
    settled = Operation.objects.exclude(settled_at=None).order_by("-settled_at").first()
    assert value(got, "koala_last_operation_completed_timestamp_seconds") == (
        pytest.approx(settled.settled_at.timestamp(), abs=1e-3) if settled else 0
    )
    # The breaker, pauses, the beat, schedules, the scrape itself.
    assert value(got, "koala_breaker_trips_total", kind="boom") == 1
    assert value(got, "koala_breaker_tripped", kind="boom") == 1
    assert value(got, "koala_pauses", scope="kind") == 1
    assert value(got, "koala_pauses", scope="global") == 0
    assert value(got, "koala_beat_last_tick_timestamp_seconds") == pytest.approx(rows["now"].timestamp(), abs=1e-3)
    assert value(got, "koala_schedule_last_slot_timestamp_seconds", schedule="nightly") == pytest.approx(
        (rows["now"] - dt.timedelta(days=1)).timestamp(), abs=1e-3
    )
    assert value(got, "koala_schedule_next_slot_timestamp_seconds", schedule="nightly") == pytest.approx(
        (rows["now"] + dt.timedelta(hours=3)).timestamp(), abs=1e-3
    )
    assert 0 < value(got, "koala_scrape_duration_seconds") < 5
    assert value(got, "koala_up") == 1
    assert "koala_metrics_fold_lag_seconds" in got

    # A fold moves rows into the tallies: every number stays exactly what it was.
    assert services.fold().folded
    assert CompletionTally.objects.exists()
    again = scrape(client)
    for name in ("koala_jobs", "koala_job_completions_total", "koala_job_failures_total", "koala_rejections_total"):
        assert again[name] == got[name], name
    assert again["koala_attempt_duration_seconds_bucket"] == got["koala_attempt_duration_seconds_bucket"]


def _by(attempts: Any, *fields: str) -> dict[tuple[str, ...], int]:
    counts: dict[tuple[str, ...], int] = {}
    for row in attempts.values_list(*fields):
        counts[row] = counts.get(row, 0) + 1
    return counts


def test_a_token_is_required_once_configured_and_a_wrong_one_reveals_nothing(client: Client, settings: Any) -> None:
    settings.KOALA_METRICS_TOKEN = "t0ken-for-scrapes"
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    missing = client.get("/metrics")
    assert wrong.status_code == missing.status_code == 401
    assert wrong.content == missing.content == b"unauthorized\n"
    assert b"koala_" not in wrong.content
    assert client.get("/metrics", headers={"Authorization": "Bearer t0ken-for-scrapes"}).status_code == 200


def test_without_a_token_only_loopback_clients_may_scrape(settings: Any) -> None:
    settings.KOALA_METRICS_TOKEN = ""
    assert Client(HTTP_HOST="localhost", REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    assert Client(HTTP_HOST="localhost", REMOTE_ADDR="::1").get("/metrics").status_code == 200


def _finished_days_ago(ids: list[int], days: int) -> None:
    """As if the jobs (and their attempts) had finished ``days`` ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workers_job SET finished_at = now() - make_interval(days => %s), "
            "created_at = now() - make_interval(days => %s + 1) WHERE id = ANY(%s)",
            [days, days, ids],
        )
        cursor.execute(
            "UPDATE workers_attempt SET started_at = now() - make_interval(days => %s, secs => 1), "
            "finished_at = now() - make_interval(days => %s) WHERE job_id = ANY(%s)",
            [days, days, ids],
        )


def test_pruning_never_lowers_the_completion_counter(client: Client, redis_clean: None) -> None:
    folded, unfolded = _succeeded(3, "a"), _succeeded(2, "b")
    _finished_days_ago(folded, 45)
    _finished_days_ago(unfolded, 40)
    # The beat folded up to 42 days ago, then stopped: three are in the tallies, two only in the tail.
    services.fold(until=timezone.now() - dt.timedelta(days=42))
    assert sum(CompletionTally.objects.values_list("count", flat=True)) == 3
    before = scrape(client)
    assert value(before, "koala_job_completions_total", queue="default", kind="noop", outcome="succeeded") == 5
    assert value(before, "koala_attempt_duration_seconds_count", kind="noop", part="total") == 5
    assert value(before, "koala_jobs", queue="default", state="succeeded") == 5

    report = retention.prune(days=30)

    assert report.jobs == 5 and not Job.objects.exists()
    after = scrape(client)
    assert value(after, "koala_job_completions_total", queue="default", kind="noop", outcome="succeeded") == 5
    assert value(after, "koala_attempt_duration_seconds_count", kind="noop", part="total") == 5
    assert value(after, "koala_jobs", queue="default", state="succeeded") == 0  # the rows are gone
    services.fold()
    _succeeded(1, "c")
    later = scrape(client)
    assert value(later, "koala_job_completions_total", queue="default", kind="noop", outcome="succeeded") == 6
    assert value(later, "koala_jobs", queue="default", state="succeeded") == 1


def test_two_folds_at_once_never_count_a_row_twice(client: Client, redis_clean: None) -> None:
    ids = _succeeded(4)
    # A fold holding the mark makes another skip, not wait or fold the same window again.
    services.fold()
    _succeeded(2, "more")
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM metrics_foldmark WHERE name = 'engine' FOR UPDATE")
            assert services.fold().folded is False
        holder.rollback()
    finally:
        holder.close()

    # Many folds racing: the tallies end with each attempt once.
    _succeeded(3, "race")
    barrier = threading.Barrier(4)
    results: list[services.Folded] = []
    errors: list[BaseException] = []

    def racer() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                results.append(services.fold())
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    services.fold()
    folded = sum(CompletionTally.objects.filter(kind="noop", outcome="succeeded").values_list("count", flat=True))
    mark = FoldMark.objects.get(name="engine").folded_before
    assert folded == Attempt.objects.filter(job__kind="noop", outcome="succeeded", finished_at__lt=mark).count() == 9
    assert value(scrape(client), "koala_job_completions_total", queue="default", kind="noop", outcome="succeeded") == 9
    assert len(ids) == 4


def test_rejections_survive_in_postgresql_across_a_fold(client: Client, redis_clean: None) -> None:
    services.count_rejection("lease_expired")
    services.count_rejection("not a name!")
    services.flush_rejections()
    first = scrape(client)
    assert value(first, "koala_rejections_total", reason="lease_expired") == 1
    assert value(first, "koala_rejections_total", reason="other") == 1
    assert services.fold().rejections == 2
    services.count_rejection("lease_expired")
    after = scrape(client)
    assert value(after, "koala_rejections_total", reason="lease_expired") == 2
    assert value(after, "koala_rejections_total", reason="other") == 1
