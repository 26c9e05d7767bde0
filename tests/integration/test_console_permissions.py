"""Roles are checked on the server: each role can do exactly its actions; every other
logged-in staff user gets 403 (GET and POST) and nothing changes; anonymous users are sent
to the login page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from devtools.sandbox.provider import FakeProvider
from koala.models import AuditEvent
from reviews.models import ReviewRequest
from tests.support.console_scenarios import BEARER, CARD, failed_job_with_secrets, pending_review, uncertain_charge
from workers.models import Budget, Job, ModelPrice, Operation, Pause
from workers.services.budgets import create_budget
from workers.services.jobs import enqueue
from workers.services.pauses import pause

# transaction=True: the world each test acts on is reached through the in-process runtime (tests/inprocess.py).
pytestmark = [
    pytest.mark.django_db(transaction=True),
]

ROLES = ("operator", "reviewer", "auditor", "norole")


@dataclass
class World:
    queued: int
    failed: int
    pause: int
    budget: int
    review: int
    operation: int


@pytest.fixture
def world(role_users: Any, provider: FakeProvider, redis_clean: None, settings: Any) -> World:
    """One of everything a console page shows or changes, made through the real services."""
    failed = failed_job_with_secrets().pk
    review = pending_review(requested_by="someone-else").pk
    operation = uncertain_charge(provider, settings).pk
    queued = enqueue(kind="noop", input={}, queue="bulk").job_id  # no worker serves "bulk" here
    held = pause(scope="kind", target="demo.flaky", reason="testing", actor="setup").pk
    budget = create_budget(name="daily", scope="global", spend_limit_minor=10_000, actor="setup").pk
    return World(queued=queued, failed=failed, pause=held, budget=budget, review=review, operation=operation)


def view_pages(w: World) -> list[str]:
    return [
        "/admin/console/",
        "/admin/console/jobs/",
        "/admin/console/jobs/?state=failed&kind=boom",
        f"/admin/console/jobs/{w.failed}/",
        "/admin/console/failures/",
        "/admin/console/exports/",
        "/admin/console/pauses/",
        "/admin/console/attention/",
        "/admin/console/budgets/",
        f"/admin/console/budgets/{w.budget}/",
        "/admin/console/reviews/",
        f"/admin/console/reviews/{w.review}/",
        "/admin/console/schedules/",
    ]


def test_every_role_reads_every_page_and_a_staff_user_without_a_role_reads_none(world: World, clients: dict[str, Client]) -> None:
    for url in view_pages(world):
        for role in ("operator", "reviewer", "auditor"):
            response = clients[role].get(url)
            assert response.status_code == 200, (role, url, response.status_code)
            html = response.content.decode()
            assert CARD not in html and BEARER not in html, url  # the HTML never holds a masked value
        assert clients["norole"].get(url).status_code == 403, url
        assert clients["norole"].post(url, {}).status_code == 403, url
        anonymous = clients["anonymous"].get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/"), url


@dataclass
class Action:
    name: str
    role: str  # the only role allowed
    url: Callable[[World], str]
    data: Callable[[World], dict[str, Any]]
    changed: Callable[[World], bool]  # the state change it makes
    audit: str  # the audit action it writes


def _job_state(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


ACTIONS = [
    Action(
        "cancel",
        "operator",
        lambda w: f"/admin/console/jobs/{w.queued}/act/",
        lambda w: {"action": "cancel", "reason": "no longer needed"},
        lambda w: _job_state(w.queued) == "cancelled",
        "cancel",
    ),
    Action(
        "requeue",
        "operator",
        lambda w: f"/admin/console/jobs/{w.queued}/act/",
        lambda w: {"action": "requeue"},
        lambda w: AuditEvent.objects.filter(action="requeue", target_id=str(w.queued)).exists(),
        "requeue",
    ),
    Action(
        "retry",
        "operator",
        lambda w: f"/admin/console/jobs/{w.failed}/act/",
        lambda w: {"action": "retry"},
        lambda w: Job.objects.filter(retry_of_id=w.failed).exists(),
        "retry",
    ),
    Action(
        "bulk cancel",
        "operator",
        lambda w: "/admin/console/jobs/bulk/",
        lambda w: {"action": "cancel", "scope": "selected", "ids": [str(w.queued)], "reason": "bulk"},
        lambda w: _job_state(w.queued) == "cancelled",
        "bulk_cancel",
    ),
    Action(
        "pause",
        "operator",
        lambda w: "/admin/console/pauses/new/",
        lambda w: {"scope": "queue", "target": "bulk", "mode": "drain", "reason": "provider incident"},
        lambda w: Pause.objects.filter(scope="queue", target="bulk", lifted_at__isnull=True).exists(),
        "pause",
    ),
    Action(
        "resume",
        "operator",
        lambda w: f"/admin/console/pauses/{w.pause}/resume/",
        lambda w: {"note": "fixed"},
        lambda w: Pause.objects.get(pk=w.pause).lifted_at is not None,
        "resume",
    ),
    Action(
        "resolve",
        "operator",
        lambda w: f"/admin/console/attention/{w.operation}/resolve/",
        lambda w: {"outcome": "happened", "external_id": "ch_seen", "note": "seen in the provider dashboard"},
        lambda w: Operation.objects.get(pk=w.operation).state == "reconciled",
        "operation.resolve",
    ),
    Action(
        "create budget",
        "operator",
        lambda w: "/admin/console/budgets/new/",
        lambda w: {
            "name": "queue-bulk",
            "scope": "queue",
            "target": "bulk",
            "timezone": "Europe/Paris",
            "currency": "EUR",
            "request_limit": "100",
        },
        lambda w: Budget.objects.filter(name="queue-bulk").exists(),
        "budget.create",
    ),
    Action(
        "update budget",
        "operator",
        lambda w: f"/admin/console/budgets/{w.budget}/update/",
        lambda w: {"spend_limit_minor": "20000"},
        lambda w: Budget.objects.get(pk=w.budget).spend_limit_minor == 20_000,
        "budget.update",
    ),
    Action(
        "set price",
        "operator",
        lambda w: "/admin/console/prices/",
        lambda w: {"model": "m-small", "input_minor_per_mtok": "30", "output_minor_per_mtok": "60"},
        lambda w: ModelPrice.objects.filter(model="m-small", input_minor_per_mtok=30).exists(),
        "price.set",
    ),
    Action(
        "approve",
        "reviewer",
        lambda w: f"/admin/console/reviews/{w.review}/decide/",
        lambda w: {"decision": "approve", "comment": "ok"},
        lambda w: ReviewRequest.objects.get(pk=w.review).state == "approved",
        "review.approve",
    ),
    Action(
        "reject",
        "reviewer",
        lambda w: f"/admin/console/reviews/{w.review}/decide/",
        lambda w: {"decision": "reject", "comment": "not this customer"},
        lambda w: ReviewRequest.objects.get(pk=w.review).state == "rejected",
        "review.reject",
    ),
]


@pytest.mark.parametrize("action", ACTIONS, ids=[a.name for a in ACTIONS])
def test_each_action_is_allowed_to_exactly_one_role(action: Action, world: World, clients: dict[str, Client]) -> None:
    url, data = action.url(world), action.data(world)
    for role in ROLES:
        if role == action.role:
            continue
        assert clients[role].post(url, data).status_code == 403, role
        assert clients[role].get(url).status_code == 403, role
        assert not action.changed(world), f"{role} changed something through {action.name}"
    assert not AuditEvent.objects.filter(action=action.audit).exclude(actor="setup").exists()
    anonymous = clients["anonymous"].post(url, data)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")

    allowed = clients[action.role]
    assert allowed.get(url).status_code == 405  # a change is never a GET
    response = allowed.post(url, data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert action.changed(world)
    username = {"operator": "olga", "reviewer": "rita"}[action.role]
    assert AuditEvent.objects.filter(action=action.audit, actor=username).exists()


def test_every_change_needs_the_csrf_token(world: World, role_users: Any) -> None:
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(role_users["operator"])
    response = strict.post(f"/admin/console/jobs/{world.queued}/act/", {"action": "cancel"})
    assert response.status_code == 403
    assert _job_state(world.queued) == "queued"


def test_the_admin_job_actions_are_the_operators_too(world: World, clients: dict[str, Client]) -> None:
    # Every role may view jobs in the Django admin; its cancel/retry/requeue actions are the operators'.
    action = {"action": "cancel_jobs", "_selected_action": [str(world.queued)]}
    for role in ("reviewer", "auditor"):
        listing = clients[role].get("/admin/workers/job/")
        assert listing.status_code == 200 and "cancel_jobs" not in listing.content.decode()
        clients[role].post("/admin/workers/job/", action)
        assert _job_state(world.queued) == "queued", role
    assert "cancel_jobs" in clients["operator"].get("/admin/workers/job/").content.decode()
    clients["operator"].post("/admin/workers/job/", action)
    assert _job_state(world.queued) == "cancelled"


def test_reading_a_job_in_the_admin_or_the_console_is_audited(world: World, clients: dict[str, Client]) -> None:
    assert clients["auditor"].get(f"/admin/workers/job/{world.failed}/change/").status_code == 200
    assert clients["auditor"].get(f"/admin/console/jobs/{world.failed}/").status_code == 200
    reads = AuditEvent.objects.filter(actor="aude", action="read", target_type="job", target_id=str(world.failed))
    assert reads.count() == 2
