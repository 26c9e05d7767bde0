"""Console actions beyond the permission matrix: the global pause's confirmation step, bulk
actions on a filtered selection, and the pause banner on every admin page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from koala.models import AuditEvent
from workers.models import Job, Pause
from workers.services.jobs import enqueue
from workers.services.pauses import pause

# Plain django_db: each action is one request through the services, inside the test's transaction.
pytestmark = pytest.mark.django_db


def test_a_global_pause_needs_a_second_confirming_post(clients: dict[str, Client], redis_clean: None) -> None:
    operator = clients["operator"]
    form = {"scope": "global", "mode": "stop", "reason": "database failover", "expires_in_minutes": "30"}
    first = operator.post("/admin/console/pauses/new/", form)
    assert first.status_code == 200
    assert "Pause everything?" in first.content.decode() and 'name="confirm" value="True"' in first.content.decode()
    assert not Pause.objects.exists()
    second = operator.post("/admin/console/pauses/new/", {**form, "confirm": "True"})
    assert second.status_code == 302
    live = Pause.objects.get()
    assert (live.scope, live.mode, live.created_by, live.reason) == ("global", "stop", "olga", "database failover")
    assert live.expires_at is not None
    # A queue pause is one step, and a missing reason is refused with the form shown again.
    refused = operator.post("/admin/console/pauses/new/", {"scope": "queue", "target": "bulk", "mode": "drain", "reason": ""})
    assert refused.status_code == 400 and Pause.objects.count() == 1


def test_a_second_pause_of_the_same_scope_is_refused_with_the_services_reason(
    clients: dict[str, Client], redis_clean: None
) -> None:
    pause(scope="queue", target="bulk", reason="first", actor="setup")
    response = clients["operator"].post(
        "/admin/console/pauses/new/", {"scope": "queue", "target": "bulk", "mode": "drain", "reason": "again"}
    )
    assert response.status_code == 400
    assert "already paused" in response.content.decode()


def test_a_tenants_pause_from_the_console_holds_that_tenant_only(clients: dict[str, Client], redis_clean: None) -> None:
    operator = clients["operator"]
    # A global pause of one tenant stops nobody else: no confirmation step.
    made = operator.post("/admin/console/pauses/new/", {"scope": "global", "tenant": "acme", "mode": "drain", "reason": "acme"})
    assert made.status_code == 302
    live = Pause.objects.get()
    assert (live.scope, live.target, live.tenant) == ("global", "", "acme")
    page = operator.get("/admin/console/pauses/").content.decode()
    assert f'data-pause="{live.pk}" data-scope="global" data-target="" data-tenant="acme"' in page
    assert "for tenant <code>acme</code>" in page
    # The dashboard's queues are not "paused": other tenants' jobs run there.
    enqueue(kind="noop", input={})
    board = operator.get("/admin/console/").content.decode()
    assert 'data-queue="default"' in board and "data-paused=" not in board and 'id="pause-banner"' in board
    # A tenant the service refuses is said on the form, and nothing is paused.
    refused = operator.post(
        "/admin/console/pauses/new/", {"scope": "queue", "target": "bulk", "tenant": " acme", "mode": "drain", "reason": "x"}
    )
    assert refused.status_code == 400 and "spaces around" in refused.content.decode()
    assert Pause.objects.count() == 1
    # Every tenant's pause of the same scope is its own row.
    assert operator.post("/admin/console/pauses/new/", {"scope": "global", "mode": "drain", "reason": "all"}).status_code == 200
    assert Pause.objects.count() == 1  # ... which asks for confirmation first


def test_bulk_cancel_applies_to_everything_the_filter_matches(clients: dict[str, Client], redis_clean: None) -> None:
    bulk = [enqueue(kind="noop", input={}, queue="bulk").job_id for _ in range(7)]
    other = [enqueue(kind="noop", input={}, queue="critical").job_id for _ in range(3)]
    response = clients["operator"].post(
        "/admin/console/jobs/bulk/",
        {"action": "cancel", "scope": "all", "queue": "bulk", "state": "queued", "reason": "bad batch"},
    )
    assert response.status_code == 302 and "queue=bulk" in response["Location"]
    assert set(Job.objects.filter(pk__in=bulk).values_list("state", flat=True)) == {"cancelled"}
    assert set(Job.objects.filter(pk__in=other).values_list("state", flat=True)) == {"queued"}
    summary = AuditEvent.objects.get(action="bulk_cancel")
    assert summary.actor == "olga" and sorted(summary.details["done"]) == sorted(bulk)
    assert AuditEvent.objects.filter(action="cancel", actor="olga").count() == 7  # each job through its service


def test_bulk_reports_what_it_could_not_do(clients: dict[str, Client], redis_clean: None) -> None:
    queued = enqueue(kind="noop", input={}, queue="bulk").job_id
    done = enqueue(kind="noop", input={}, queue="bulk").job_id
    clients["operator"].post("/admin/console/jobs/bulk/", {"action": "cancel", "scope": "selected", "ids": [str(done)]})
    response = clients["operator"].post(
        "/admin/console/jobs/bulk/", {"action": "cancel", "scope": "selected", "ids": [str(queued), str(done)]}, follow=True
    )
    text = response.content.decode()
    assert "Cancelled: 1 job(s)." in text and "terminal states never change" in text
    nothing = clients["operator"].post("/admin/console/jobs/bulk/", {"action": "cancel", "scope": "selected"}, follow=True)
    assert "Tick at least one job" in nothing.content.decode()


def test_the_pause_banner_is_on_every_admin_page_for_staff_only(clients: dict[str, Client], redis_clean: None) -> None:
    pause(scope="kind", target="email.send", mode="stop", reason="SMTP relay down", actor="setup")
    for url in ("/admin/", "/admin/workers/job/", "/admin/koala/auditevent/", "/admin/console/", "/admin/console/budgets/"):
        html = clients["auditor"].get(url).content.decode()
        assert 'id="pause-banner"' in html and "SMTP relay down" in html, url
    login = clients["anonymous"].get("/admin/login/").content.decode()
    assert "SMTP relay down" not in login
    # Staff without a console role: the pause page refuses them, so neither the banner nor its link.
    norole = clients["norole"].get("/admin/").content.decode()
    assert "SMTP relay down" not in norole and 'href="/admin/console/' not in norole


def test_the_admin_index_links_every_console_page(clients: dict[str, Client]) -> None:
    html = clients["reviewer"].get("/admin/").content.decode()
    for url in (
        "/admin/console/",
        "/admin/console/jobs/",
        "/admin/console/failures/",
        "/admin/console/reviews/",
        "/admin/console/attention/",
        "/admin/console/pauses/",
        "/admin/console/budgets/",
    ):
        assert f'href="{url}"' in html, url


def test_static_files_are_served_by_the_app(clients: dict[str, Client]) -> None:
    # WhiteNoise serves the admin's and Koala's CSS from the app: nothing comes from a CDN.
    for path in ("/static/koala/admin.css", "/static/admin/css/base.css"):
        response = clients["anonymous"].get(path)
        assert response.status_code == 200, path
        b"".join(response.streaming_content if response.streaming else [response.content])
    html = clients["operator"].get("/admin/console/").content.decode()
    external = re.findall(r'(?:src|href)="((?:https?:)?//[^"]*)"', html)
    assert external == [], external
    assert re.search(r'<link rel="stylesheet" href="/static/koala/admin.css"', html)


def test_cookies_are_secure_outside_debug(settings: Any) -> None:
    from django.conf import settings as live

    assert not live.DEBUG
    assert live.SESSION_COOKIE_SECURE and live.CSRF_COOKIE_SECURE and live.SESSION_COOKIE_HTTPONLY and live.CSRF_COOKIE_HTTPONLY


def test_bulk_with_an_invalid_filter_changes_nothing(clients: dict[str, Client], redis_clean: None) -> None:
    jobs = [enqueue(kind="noop", input={}, queue="bulk").job_id for _ in range(3)]
    response = clients["operator"].post(
        "/admin/console/jobs/bulk/", {"action": "cancel", "scope": "all", "queue": "bulk", "cause": "no-such-reason"}, follow=True
    )
    assert "filter is invalid" in response.content.decode()
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {"queued"}


def test_identifiers_shown_on_pages_pass_the_redaction_layer(clients: dict[str, Client], redis_clean: None) -> None:
    token = "tok_live_abcdefgh12345678"  # credential-shaped: the redaction layer masks it
    job_id = enqueue(kind="noop", input={"note": f"see {token}"}, idempotency_key=f"import-{token}").job_id
    html = clients["auditor"].get(f"/admin/console/jobs/{job_id}/").content.decode()
    assert token not in html and "import-[redacted]" in html
