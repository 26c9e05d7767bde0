"""Issue 5's browser tests: Debian's chromium, driven by Playwright, against a live server,
with a real worker (and beat) subprocess doing the work and the loopback provider as the
outside world. What the browser shows is checked against the database and the provider's
own record; each test saves screenshots (KOALA_SCREENSHOT_DIR, .koala-data/screenshots/)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from devtools.sandbox.provider import FakeProvider
from exports.models import Account, Export, ExportState
from exports.services import grant_account_access
from koala.models import AuditEvent
from reviews.models import ReviewRequest
from tests.conftest import Processes, wait_for
from tests.inprocess import beat_tick, run_export
from tests.support.console import PASSWORD, make_user
from tests.support.console_scenarios import BEARER, CARD
from tests.support.effects import effects_env
from tests.support.exports import load_events
from tests.support.fleet import ring_for, wait_quiet, wait_state, wait_workers_ready
from workers.models import Attempt, BudgetUsage, Job, JobState, Operation
from workers.services.budgets import create_budget, set_model_price
from workers.services.jobs import enqueue

# transaction=True: a live server thread and real worker/beat subprocesses read these rows on their own connections.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]


class Person:
    """One logged-in browser session (its own cookies), with screenshots by name."""

    def __init__(self, browser: Any, base_url: str, user: User, shots: Path) -> None:
        self.context = browser.new_context(base_url=base_url, viewport={"width": 1440, "height": 1000})
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.shots = shots
        self.page.goto("/admin/login/?next=/admin/console/")
        self.page.fill("#id_username", user.username)
        self.page.fill("#id_password", PASSWORD)
        self.page.click("input[type=submit]")
        self.page.wait_for_url("**/admin/console/")

    def go(self, path: str) -> Any:
        response = self.page.goto(path)
        assert response is not None and response.status == 200, f"{path}: {response.status if response else 'no response'}"
        return response

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)

    def html(self) -> str:
        return str(self.page.content())


@pytest.fixture
def people(browser: Any, live_server: Any, screenshot_dir: Path, role_users: dict[str, User]) -> Iterator[Any]:
    opened: list[Person] = []

    def login(role_or_user: str | User) -> Person:
        user = role_users[role_or_user] if isinstance(role_or_user, str) else role_or_user
        person = Person(browser, live_server.url, user, screenshot_dir)
        opened.append(person)
        return person

    yield login
    for person in opened:
        person.context.close()


@pytest.fixture
def fleet(processes: Processes, provider: FakeProvider) -> Processes:
    """A real worker on the default queue and a beat, serving the built-in side-effect kinds."""
    env = effects_env(provider, KOALA_PAYMENTS_TIMEOUT_SECONDS="0.5")
    worker = processes.worker(env=env)
    processes.beat(env=env)
    wait_workers_ready([worker])
    return processes


def shop(reference: str, amount: int, *, created_by: str = "") -> int:
    data = {"reference": reference, "amount_minor": amount, "currency": "EUR"}
    return enqueue(kind="shop.order_and_charge", input=data, idempotency_key=f"shop-{reference}", created_by=created_by).job_id


# 1 ------------------------------------------------------------------------------------------------
def test_reviewer_approves_a_critical_charge_and_the_requester_cannot(
    fleet: Processes, provider: FakeProvider, people: Any, role_users: dict[str, User]
) -> None:
    requester = role_users["reviewer"]  # rita enqueued the job: she may not approve its charge
    approver = User.objects.create_user("rex", "rex@example.com", PASSWORD, is_staff=True)
    approver.groups.add(*requester.groups.all())
    job_id = shop("o-browser-review", 7250, created_by=requester.username)
    wait_state(job_id, JobState.PARKED)
    review = ReviewRequest.objects.get(job_id=job_id, state="pending")
    assert provider.effects("charges") == [] and len(provider.effects("orders")) == 1

    rita = people(requester)
    rita.go(f"/admin/console/reviews/{review.pk}/")
    approve = rita.page.locator("#approve")
    assert approve.is_disabled()
    assert "four-eyes" in rita.page.inner_text("#approve-why")
    rita.shot("review-four-eyes")
    # Even with the button forced on, the server refuses her approval and says why.
    rita.page.evaluate("document.querySelector('#approve').removeAttribute('disabled')")
    rita.page.click("#approve")
    assert "four-eyes" in rita.page.inner_text("#decision-error")
    assert ReviewRequest.objects.get(pk=review.pk).state == "pending"

    rex = people(approver)
    rex.go("/admin/console/reviews/")
    row = rex.page.locator(f"#pending-reviews tr[data-review='{review.pk}']")
    assert "72.50 EUR" in row.inner_text() and "o-browser-review" in row.inner_text()
    rex.shot("review-queue")
    row.locator("a").first.click()
    assert rex.page.inner_text("#review-digest") == review.digest
    rex.page.fill("textarea[name=comment]", "customer confirmed by phone")
    rex.page.click("#approve")
    rex.page.wait_for_url("**/admin/console/reviews/")
    assert "approved" in rex.page.inner_text(".messagelist")

    job = wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED)
    assert job.state == JobState.SUCCEEDED, job.error_message
    [charge] = provider.effects("charges")  # exactly one charge in the provider's own record
    assert charge["amount_minor"] == 7250 and job.result["charge"] == charge["id"]
    assert ReviewRequest.objects.get(pk=review.pk).state == "used"
    rex.go(f"/admin/console/jobs/{job_id}/")
    assert rex.page.inner_text("#job-state") == "succeeded"
    assert charge["id"] in rex.page.inner_text("#operations")
    rex.shot("job-detail")
    rex.go("/admin/console/reviews/")
    assert rex.page.locator(f"#review-history tr[data-review='{review.pk}']").get_attribute("data-state") == "used"
    assert AuditEvent.objects.filter(action="review.approve", actor="rex", target_id=str(review.pk)).exists()


# 2 ------------------------------------------------------------------------------------------------
def test_operator_drains_a_queue_and_resumes_it(fleet: Processes, people: Any) -> None:
    olga = people("operator")
    olga.go("/admin/console/pauses/")
    olga.page.select_option("select[name=scope]", "queue")
    olga.page.fill("input[name=target]", "default")
    olga.page.check("input[name=mode][value=drain]")
    olga.page.fill("input[name=reason]", "provider incident INC-42")
    olga.page.click("#pause-form button[type=submit]")
    olga.page.wait_for_url("**/admin/console/pauses/")
    assert "INC-42" in olga.page.inner_text("#pause-banner")
    olga.shot("pauses")

    jobs = [enqueue(kind="noop", input={}).job_id for _ in range(3)]
    # Doorbells naming them reach the worker, and the beat ticks: a paused queue claims nothing.
    ring_for("default", jobs)
    beat_tick()
    wait_quiet("default")
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {JobState.QUEUED}
    assert all(p.poll() is None for p in fleet.procs), "the worker is alive, just not claiming"
    for page in ("/admin/console/", "/admin/", "/admin/workers/job/"):  # the banner is on every admin page
        olga.go(page)
        assert "queue default" in olga.page.inner_text("#pause-banner")
    olga.go("/admin/console/")
    row = olga.page.locator("#queues tr[data-queue='default']")
    assert row.get_attribute("data-depth") == "3"
    olga.shot("dashboard-paused")

    olga.go("/admin/console/pauses/")
    olga.page.locator("#active-pauses tr[data-target='default'] button").click()
    olga.page.wait_for_url("**/admin/console/pauses/")
    assert olga.page.locator("#pause-banner").count() == 0
    for job_id in jobs:
        wait_state(job_id, JobState.SUCCEEDED)
    assert AuditEvent.objects.filter(action="pause", actor="olga").exists()
    assert AuditEvent.objects.filter(action="resume", actor="olga").exists()


# 3 ------------------------------------------------------------------------------------------------
def test_failed_job_page_shows_the_redacted_message_and_never_the_secret(fleet: Processes, people: Any) -> None:
    job_id = enqueue(kind="boom", input={"card": CARD, "bearer": BEARER, "order": "A-7"}).job_id
    job = wait_state(job_id, JobState.FAILED)
    assert "[redacted]" in job.error_message

    aude = people("auditor")
    for path in (f"/admin/console/jobs/{job_id}/", "/admin/console/failures/", "/admin/console/jobs/?state=failed"):
        aude.go(path)
        html = aude.html()
        assert CARD not in html and BEARER not in html, path
    aude.go(f"/admin/console/jobs/{job_id}/")
    error = aude.page.inner_text("#job-error")
    assert error.startswith("ValueError: charge failed for card [redacted]") and "Authorization: [redacted]" in error
    assert "A-7" in aude.page.inner_text("#job-input")  # the rest of the input stays readable
    assert aude.page.locator("#job-actions button").count() == 0  # an auditor only reads
    aude.shot("job-failed-redacted")
    aude.go("/admin/console/failures/")
    aude.shot("failures")
    assert AuditEvent.objects.filter(action="read", actor="aude", target_type="job", target_id=str(job_id)).exists()


# 4 ------------------------------------------------------------------------------------------------
def test_dashboard_backlog_age_and_depth_match_the_database(people: Any, redis_clean: None) -> None:
    # "bulk" has no worker in this test: the backlog stays where it is.
    first = enqueue(kind="noop", input={}, queue="bulk").job_id
    time.sleep(2)  # wall time on purpose: the backlog's age on the page is time since scheduled_at
    later = [enqueue(kind="noop", input={}, queue="bulk").job_id for _ in range(24)]
    enqueue(kind="noop", input={}, queue="bulk", delay_seconds=3600)  # queued but not due: depth, not age

    olga = people("operator")
    before = timezone.now()
    olga.go("/admin/console/")
    after = timezone.now()
    row = olga.page.locator("#queues tr[data-queue='bulk']")
    oldest = Job.objects.filter(queue="bulk", state="queued", scheduled_at__lte=after).order_by("scheduled_at", "id").first()
    assert oldest is not None and oldest.pk == first and first not in later
    assert int(row.get_attribute("data-depth")) == Job.objects.filter(queue="bulk", state="queued").count() == 26
    assert int(row.get_attribute("data-due")) == 25
    assert int(row.get_attribute("data-oldest-job")) == first
    age = float(row.get_attribute("data-oldest-age-seconds"))
    assert (before - oldest.scheduled_at).total_seconds() - 0.5 <= age <= (after - oldest.scheduled_at).total_seconds() + 0.5
    assert age >= 2
    assert f"#{first}" in row.locator("td.oldest-age").inner_text()
    olga.shot("dashboard-backlog")


# 5 ------------------------------------------------------------------------------------------------
def test_uncertain_charge_resolved_as_happened_completes_without_a_second_charge(
    fleet: Processes, provider: FakeProvider, people: Any
) -> None:
    provider.fault("lookup_disabled", resource="charges")
    provider.fault("commit_then_timeout", resource="charges", seconds=2, times=1)
    job_id = shop("o-browser-blind", 1800)
    job = wait_state(job_id, JobState.PARKED, timeout=40)
    assert job.park_reason == "needs_attention"
    operation = Operation.objects.get(job_id=job_id, name="charge")
    assert operation.state == "uncertain"
    [charge] = provider.effects("charges")  # it did happen; Koala cannot know

    olga = people("operator")
    olga.go("/admin/console/attention/")
    card = olga.page.locator(f"#operation-{operation.pk}")
    assert "o-browser-blind" in card.inner_text()
    olga.shot("needs-attention")
    card.locator("input[name=outcome][value=happened]").check()
    card.locator("input[name=external_id]").fill(charge["id"])
    card.locator("textarea[name=note]").fill("seen in the provider dashboard")
    card.locator("button[type=submit]").click()
    olga.page.wait_for_url("**/admin/console/attention/")
    assert olga.page.locator("#nothing-to-resolve").is_visible()

    job = wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=30)
    assert job.state == JobState.SUCCEEDED, job.error_message
    assert job.result["charge"] == charge["id"]
    assert len(provider.effects("charges")) == 1 and len(provider.requests("charges")) == 1  # never re-sent
    operation.refresh_from_db()
    assert (operation.state, operation.resolution) == ("reconciled", "manual_happened")
    wait_for(lambda: not Job.objects.filter(pk=job_id, state=JobState.PARKED).exists(), what="unparked")


# The dashboard's other numbers ------------------------------------------------------------------------
def test_dashboard_activity_numbers_match_the_database(fleet: Processes, provider: FakeProvider, people: Any) -> None:
    budget = create_budget(
        name="daily-spend", scope="global", timezone="Europe/Paris", spend_limit_minor=20_000, request_limit=40, actor="setup"
    )
    set_model_price(model="m-small", input_minor_per_mtok=150_000, output_minor_per_mtok=600_000, actor="setup")
    jobs = [enqueue(kind="noop", input={}).job_id for _ in range(6)]
    jobs += [enqueue(kind="boom", input={"card": CARD, "bearer": BEARER}).job_id for _ in range(2)]
    jobs += [enqueue(kind="demo.flaky", input={"succeed_on": 2}).job_id for _ in range(2)]
    jobs += [shop(f"o-dash-{n}", amount) for n, amount in enumerate((1200, 2500, 800))]
    jobs.append(enqueue(kind="model.complete", input={"model": "m-small", "prompt": "Summarise the day."}).job_id)
    wait_for(lambda: not Job.objects.filter(pk__in=jobs).exclude(state__in=["succeeded", "failed"]).exists(), timeout=60)
    for _ in range(4):
        enqueue(kind="noop", input={}, queue="bulk")

    olga = people("operator")
    olga.go("/admin/console/")
    row = olga.page.locator("#queues tr[data-queue='default']")
    finished = Job.objects.filter(queue="default", finished_at__isnull=False)
    assert int(row.get_attribute("data-succeeded-1h")) == finished.filter(state="succeeded").count() == 12
    assert int(row.get_attribute("data-failed-1h")) == finished.filter(state="failed").count() == 2
    assert int(row.get_attribute("data-succeeded-24h")) == 12 and int(row.get_attribute("data-failed-24h")) == 2
    assert "14.3%" in row.inner_text()  # 2 failed of 14 finished
    assert olga.page.locator("#queues tr[data-queue='bulk']").get_attribute("data-depth") == "4"
    throughput = olga.page.locator("[data-chart='completed-jobs-per-hour'] [data-series='succeeded']")
    assert throughput.get_attribute("data-total") == "12"
    retried = olga.page.locator("[data-chart='errors-per-hour'] [data-series='retried-or-orphaned-attempts']")
    assert retried.get_attribute("data-total") == str(Attempt.objects.filter(outcome="retry").count()) == "2"
    cost = olga.page.locator("[data-chart='cost-per-hour-eur'] [data-series='cost']")  # in EUR, as the budgets are
    settled = sum(Operation.objects.filter(cost_minor__isnull=False).values_list("cost_minor", flat=True))
    assert float(cost.get_attribute("data-total")) == pytest.approx(settled / 100) and settled >= 4500
    usage = BudgetUsage.objects.get(budget=budget)
    spend = olga.page.locator("#budgets .usage-row[data-what='spend']")
    assert int(spend.get_attribute("data-used")) == usage.spent_minor + usage.reserved_minor == settled
    assert olga.page.locator("#workers tr[data-status='idle'], #workers tr[data-status='healthy']").count() == 1
    assert "Completed jobs per hour (Europe/Paris)" in olga.page.inner_text("[data-chart='completed-jobs-per-hour']")
    olga.shot("dashboard")
    olga.go("/admin/console/budgets/")
    assert olga.page.locator(f"#budget-list tr[data-budget='{budget.pk}'] .usage-row[data-what='spend']").get_attribute(
        "data-used"
    ) == str(settled)
    olga.shot("budgets")
    olga.go("/admin/console/jobs/?queue=default")
    assert olga.page.locator("#job-list tr[data-job]").count() == 14
    olga.shot("jobs")


# The Exports page: a member requests an export, then downloads it --------------------------------
def test_a_member_requests_an_export_in_the_browser_and_downloads_it(
    people: Any, role_users: dict[str, User], export_root: Path, redis_clean: None
) -> None:
    acme, globex = (Account.objects.create(slug=slug, name=slug.title()) for slug in ("acme", "globex"))
    alice = make_user("alice", "auditors")  # reads the console; a member of acme, not of globex
    grant_account_access(account_id=acme.pk, username="alice", actor="setup")
    load_events(acme, rows=2_000)
    assert globex.pk

    ana = people(alice)
    ana.go("/admin/console/exports/")
    form = ana.page.locator("#export-request-form")
    assert form.locator("select[name=account] option").all_inner_texts() == ["acme"]  # only what she may export
    # A reversed range is refused with the service's reason, and nothing is created.
    form.locator("input[name=date_from]").fill("2026-03-01")
    form.locator("input[name=date_to]").fill("2026-01-31")
    form.locator("button[type=submit]").click()
    assert "before it starts" in ana.page.inner_text("#export-request-error")
    assert not Export.objects.exists()

    form = ana.page.locator("#export-request-form")
    form.locator("input[name=date_from]").fill("2026-01-01")
    form.locator("input[name=date_to]").fill("2026-03-31")
    form.locator("button[type=submit]").click()
    ana.page.wait_for_url("**/admin/console/exports/")
    export = Export.objects.get()
    assert f"Export {export.pk} of acme requested" in ana.page.inner_text(".messagelist")
    assert ana.page.locator(f"#export-list tr[data-export='{export.pk}']").get_attribute("data-state") == "queued"
    assert AuditEvent.objects.filter(action="export.request", actor="alice", target_id=str(export.pk)).exists()

    done = run_export(export.pk)  # the exports queue's worker, in this process
    assert done.state == ExportState.SUCCEEDED
    ana.go("/admin/console/exports/")
    row = ana.page.locator(f"#export-list tr[data-export='{export.pk}']")
    assert row.get_attribute("data-state") == "succeeded"
    ana.shot("exports")
    with ana.page.expect_download() as download:
        row.locator("a.download").click()
    path = download.value.path()
    assert path is not None and hashlib.sha256(Path(path).read_bytes()).hexdigest() == done.checksum
