"""The admin pages render engine records read-only, redacted, and act only through services."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from koala.models import AuditEvent
from tests.inprocess import run_until
from workers.models import Job
from workers.services.jobs import enqueue

# Plain django_db: the pages and the cancel action are one request each in the test's transaction.
pytestmark = pytest.mark.django_db

CARD, BEARER = "4111111111111111", "tok_live_zyxwvutsrqponmlk"


@pytest.fixture
def staff_client() -> Client:
    user = get_user_model().objects.create_superuser("ops", "ops@example.com", "pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)  # the failure is reached through the real runtime (tests/inprocess.py)
def test_job_pages_never_show_secrets(redis_clean: None, staff_client: Client) -> None:
    job_id = enqueue(kind="boom", input={"card": CARD, "bearer": BEARER, "order": "A-1"}).job_id
    run_until(job_id, "failed")
    pages = [
        staff_client.get("/admin/workers/job/"),
        staff_client.get(f"/admin/workers/job/{job_id}/change/"),
        staff_client.get("/admin/workers/attempt/"),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert CARD not in html and BEARER not in html
    detail = pages[1].content.decode()
    assert "A-1" in detail and "[redacted]" in detail  # the rest of the input stays visible


def test_admin_cannot_edit_jobs_directly(redis_clean: None, staff_client: Client) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    response = staff_client.post(f"/admin/workers/job/{job_id}/change/", {"state": "succeeded"})
    assert response.status_code == 403
    assert Job.objects.get(pk=job_id).state == "queued"
    assert staff_client.get("/admin/workers/job/add/").status_code == 403


def test_admin_cancel_action_goes_through_the_service(redis_clean: None, staff_client: Client) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    response = staff_client.post("/admin/workers/job/", {"action": "cancel_jobs", "_selected_action": [str(job_id)]}, follow=True)
    assert response.status_code == 200
    assert Job.objects.get(pk=job_id).state == "cancelled"
    assert AuditEvent.objects.filter(action="cancel", actor="ops", target_id=str(job_id)).exists()


@pytest.mark.parametrize(
    ("scope", "target", "message"),
    [("queue", "nope", "unknown queue"), ("kind", "nope", "unknown job kind"), ("queue", "", "needs a target")],
)
def test_an_unknown_budget_scope_is_a_form_error(staff_client: Client, scope: str, target: str, message: str) -> None:
    """The budget service refuses it (workers.targets); the admin's form says so, not a 500."""
    from workers.models import Budget

    form = {"name": "b", "scope": scope, "target": target, "tenant": "", "timezone": "UTC", "currency": "EUR"}
    page = staff_client.post("/admin/workers/budget/add/", form)
    assert page.status_code == 200 and message in page.content.decode()
    assert not Budget.objects.exists()
    created = staff_client.post("/admin/workers/budget/add/", {**form, "scope": "queue", "target": "bulk"})
    assert created.status_code == 302 and Budget.objects.get().target == "bulk"


@pytest.mark.django_db(transaction=True)  # the job runs through the real runtime (tests/inprocess.py)
def test_the_legacy_span_table_is_no_longer_written_and_its_read_only_pages_say_legacy(
    redis_clean: None, staff_client: Client
) -> None:
    from traces.models import Span as TraceSpan
    from workers.models import Attempt, Span

    job_id = enqueue(kind="noop", input={}).job_id
    run_until(job_id, "succeeded")
    attempt = Attempt.objects.get(job_id=job_id)
    # The attempt's span went to traces_span; workers_span got nothing.
    assert TraceSpan.objects.filter(attempt=attempt, kind="attempt").count() == 1
    assert not Span.objects.exists()
    # A row as a release before the traces app stored it.
    old = Span.objects.create(job_id=job_id, attempt=attempt, trace_id="a" * 32, span_id="b" * 16, name="noop")
    listing = staff_client.get("/admin/workers/span/")
    assert listing.status_code == 200 and "<title>Legacy spans (before the traces app" in listing.content.decode()
    page = staff_client.get(f"/admin/workers/span/{old.pk}/change/")
    assert page.status_code == 200
    assert "Legacy span (no longer written" in page.content.decode() and "legacy span noop of job" in page.content.decode()
    assert staff_client.post(f"/admin/workers/span/{old.pk}/change/", {"name": "edited"}).status_code == 403
    assert staff_client.get("/admin/workers/span/add/").status_code == 403
    assert Span.objects.get(pk=old.pk).name == "noop"
