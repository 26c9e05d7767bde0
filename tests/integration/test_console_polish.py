"""What the console's pages say, checked against the records behind them (issue 12, item 6).

Each test makes its records through Koala's services and runtime (the loopback provider
for side effects) and reads the page as a person does, through the test client."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from devtools.sandbox.provider import FakeProvider
from tests.inprocess import run_until
from tests.support.console_scenarios import pending_review, uncertain_charge
from workers.models import Attempt, Job, Operation, WorkerProcess
from workers.services.budgets import create_budget, set_model_price
from workers.services.jobs import enqueue
from workers.services.pauses import pause

pytestmark = [pytest.mark.django_db(transaction=True)]


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def text(html: str) -> str:
    """The page's text, tags dropped and whitespace folded (what a person reads)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def element(html: str, element_id: str) -> str:
    found = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', html, flags=re.DOTALL)
    assert found, element_id
    return text(found.group(2)).strip()


def model_call(provider: FakeProvider) -> Job:
    set_model_price(model="m-small", input_minor_per_mtok=150_000, output_minor_per_mtok=600_000, actor="setup")
    job_id = enqueue(kind="model.complete", input={"model": "m-small", "prompt": "Summarise the day."}).job_id
    return run_until(job_id, "succeeded")


def test_costs_and_amounts_name_their_currency(
    clients: dict[str, Client], provider: FakeProvider, settings: Any, redis_clean: None
) -> None:
    job = model_call(provider)
    cost = Operation.objects.get(job_id=job.pk).cost_minor
    assert cost
    detail = page(clients["auditor"], f"/admin/console/jobs/{job.pk}/")
    assert element(detail, "job-cost").startswith(f"{cost / 100:,.2f} EUR")
    row = re.search(r'<tr data-operation="\d+".*?</tr>', detail, flags=re.DOTALL)
    assert row and f"{cost / 100:,.2f} EUR" in text(row.group(0))
    prices = text(page(clients["auditor"], "/admin/console/budgets/"))
    assert "1,500.00 EUR" in prices and "6,000.00 EUR" in prices  # per million input / output tokens
    # A charge's amount is in the charge's own currency (its parameters say which).
    charge = uncertain_charge(provider, settings)
    assert "12.00 EUR" in text(page(clients["operator"], "/admin/console/attention/"))
    assert "12.00 EUR" in text(page(clients["auditor"], f"/admin/console/jobs/{charge.job_id}/"))
    # Costs are in KOALA_COST_CURRENCY, whatever it is.
    settings.KOALA_COST_CURRENCY = "USD"
    assert element(page(clients["auditor"], f"/admin/console/jobs/{job.pk}/"), "job-cost").startswith(f"{cost / 100:,.2f} USD")


def test_an_operations_amount_is_in_the_operations_currency_whatever_its_params_hold(
    clients: dict[str, Client], settings: Any, redis_clean: None
) -> None:
    # A kind of one's own: no "currency" in its params (or a number there), no currency= given.
    settings.KOALA_COST_CURRENCY = "CHF"
    plain = enqueue(kind="tests.shapes", input={"shape": "missing", "secret": "s-1", "amount_minor": 1234}).job_id
    numbers = enqueue(kind="tests.shapes", input={"shape": "numbers", "secret": "s-2", "amount_minor": 1234}).job_id
    waiting = enqueue(kind="tests.shapes", input={"shape": "null", "secret": "s-3", "ending": "attention"}).job_id
    for job_id in (plain, numbers):
        run_until(job_id, "succeeded")
    run_until(waiting, "parked")
    # The operation keeps the currency of its amount: the kind named none, so the cost currency.
    assert set(Operation.objects.values_list("currency", flat=True)) == {"CHF"}
    settings.KOALA_COST_CURRENCY = "USD"  # a later change of the setting does not rewrite history
    for job_id in (plain, numbers):
        html = page(clients["auditor"], f"/admin/console/jobs/{job_id}/")
        row = re.search(r'<tr data-operation="\d+".*?</tr>', html, re.DOTALL)
        assert row and "12.34 CHF" in text(row.group(0)), job_id
    attention = text(page(clients["operator"], "/admin/console/attention/"))
    assert "12.34 CHF" in attention
    root = Client()
    root.force_login(User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    admin_page = text(page(root, f"/admin/workers/operation/{Operation.objects.get(job_id=plain).pk}/change/"))
    assert re.search(r"Amount minor: 1234 Currency: .*? CHF Target", admin_page)


def test_operations_recorded_before_their_currency_column_get_one(settings: Any, redis_clean: None) -> None:
    """Migration 0014: the currency a kind put in its parameters, else the cost currency."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    jobs = [enqueue(kind="tests.shapes", input={"shape": shape, "secret": "s"}).job_id for shape in ("missing", "numbers")]
    for job_id in jobs:
        run_until(job_id, "succeeded")
    named, numbered = (Operation.objects.get(job_id=job_id).pk for job_id in jobs)
    executor = MigrationExecutor(connection)
    executor.migrate([("workers", "0013_pause_tenant")])
    try:
        with connection.cursor() as cursor:  # a charge whose kind named its currency in its params
            cursor.execute("""UPDATE workers_operation SET params = '{"currency": "JPY"}' WHERE id = %s""", [named])
    finally:
        settings.KOALA_COST_CURRENCY = "SEK"
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(Operation.objects.values_list("id", "currency")) == {named: "JPY", numbered: "SEK"}


def _x_labels(html: str, chart: str) -> list[str]:
    figure = re.search(rf'<figure class="koala-chart" data-chart="{chart}".*?</figure>', html, flags=re.DOTALL)
    assert figure, chart
    return re.findall(r'<text class="axis" x="[\d.]+" y="[\d.]+" text-anchor="middle">([^<]+)</text>', figure.group(0))


def test_charts_are_in_the_budgets_time_zone_and_cost_in_their_currency(
    clients: dict[str, Client], provider: FakeProvider, redis_clean: None
) -> None:
    job = model_call(provider)
    cost = Operation.objects.get(job_id=job.pk).cost_minor or 0
    before = timezone.now()
    html = page(clients["auditor"], "/admin/console/")
    after = timezone.now()
    # No budget: the charts say UTC.
    first = {(t.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=23)) for t in (before, after)}
    assert _x_labels(html, "completed-jobs-per-hour")[0] in {f"{t:%H:00}" for t in first}
    assert "Completed jobs per hour (UTC)" in text(html)

    create_budget(name="daily", scope="global", timezone="Asia/Tokyo", spend_limit_minor=100_000, actor="setup")
    html = page(clients["auditor"], "/admin/console/")
    tokyo = ZoneInfo("Asia/Tokyo")
    for chart in ("completed-jobs-per-hour", "errors-per-hour", "cost-per-hour-eur"):
        assert _x_labels(html, chart)[0] in {f"{t.astimezone(tokyo):%H:00}" for t in first}, chart
    captions = text(html)
    assert "Completed jobs per hour (Asia/Tokyo)" in captions and "Cost per hour (EUR, Asia/Tokyo)" in captions
    # The cost chart is in EUR, as the budgets are: its total is the operations' cost in major units.
    total = re.search(r'data-chart="cost-per-hour-eur".*?data-series="cost" data-total="([\d.]+)"', html, flags=re.DOTALL)
    assert total and float(total.group(1)) == pytest.approx(cost / 100)
    assert f"{cost / 100:,.2f} EUR" in text(html)

    # Budgets in different zones: the charts fall back to UTC and say so.
    create_budget(name="paris", scope="kind", target="noop", timezone="Europe/Paris", request_limit=10, actor="setup")
    assert "Completed jobs per hour (UTC)" in text(page(clients["auditor"], "/admin/console/"))


def test_a_paused_queue_says_so_and_its_worker_is_not_idle_with_nothing_due(
    clients: dict[str, Client], redis_clean: None
) -> None:
    now = timezone.now()
    WorkerProcess.objects.create(
        name="w1", hostname="h1", pid=101, queues=["default"], worker_class="KoalaSimpleWorker", started_at=now, last_seen_at=now
    )
    for _ in range(3):
        enqueue(kind="noop", input={})
    pause(scope="queue", target="default", mode="drain", reason="deploy", actor="olga")
    html = page(clients["auditor"], "/admin/console/")
    row = re.search(r'<tr data-queue="default".*?</tr>', html, flags=re.DOTALL)
    assert row and 'data-paused="drain"' in row.group(0)
    assert "paused (drain)" in text(row.group(0))
    other = re.search(r'<tr data-queue="bulk".*?</tr>', html, flags=re.DOTALL)
    assert other and "paused" not in text(other.group(0)) and "data-paused" not in other.group(0)
    worker = re.search(r'<tr class="worker-\w+" data-status="(\w+)">.*?</tr>', html, flags=re.DOTALL)
    assert worker and worker.group(1) == "idle"
    said = text(worker.group(0))
    assert "nothing due" not in said and "queue default paused" in said and "3 due" in said


def test_the_attempt_count_explains_runs_that_gave_their_attempt_back(
    clients: dict[str, Client], provider: FakeProvider, redis_clean: None
) -> None:
    review = pending_review(requested_by="someone")
    job = Job.objects.get(pk=review.job_id)
    assert job.attempts == 0 and Attempt.objects.filter(job=job, outcome="parked").count() == 1
    line = element(page(clients["auditor"], f"/admin/console/jobs/{job.pk}/"), "job-attempts")
    assert line.startswith(f"0 of {job.max_attempts} used")
    assert "1 more run gave its attempt back (parked)" in line


def test_a_succeeded_job_shows_no_error_class(clients: dict[str, Client], redis_clean: None) -> None:
    flaky = run_until(enqueue(kind="demo.flaky", input={"succeed_on": 2}).job_id, "succeeded")
    failed = run_until(enqueue(kind="terminal", input={}).job_id, "failed")
    assert flaky.error_class  # the engine keeps the last retry's error on the job
    listing = page(clients["auditor"], "/admin/console/jobs/")
    cells = dict(re.findall(r'<tr data-job="(\d+)".*?<td class="error-class">(.*?)</td>', listing, flags=re.DOTALL))
    assert cells[str(flaky.pk)].strip() == ""
    assert cells[str(failed.pk)].strip() == failed.error_class
    detail = page(clients["auditor"], f"/admin/console/jobs/{flaky.pk}/")
    assert flaky.error_class not in element(detail, "job-error")
    assert "Retryable" in element(detail, "attempts")  # the attempt that failed still says it


def test_breadcrumbs_and_every_page_link_the_favicon(clients: dict[str, Client]) -> None:
    response = clients["anonymous"].get("/favicon.ico")
    assert response.status_code == 200 and response["Content-Type"] in {"image/x-icon", "image/vnd.microsoft.icon"}
    assert b"".join(response.streaming_content if response.streaming else [response.content])[:4] == b"\x00\x00\x01\x00"
    for url in ("/admin/login/", "/admin/", "/admin/console/"):
        html = page(clients["auditor"] if url != "/admin/login/" else clients["anonymous"], url)
        assert '<link rel="icon" href="/favicon.ico"' in html, url


def test_django_rq_is_named_like_the_other_apps() -> None:
    assert apps.get_app_config("django_rq").verbose_name == "Django-RQ"
    permission = Permission.objects.filter(content_type__app_label="django_rq").first()
    assert permission is not None and str(permission).startswith("Django-RQ | ")
