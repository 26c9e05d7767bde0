"""The execute calls over HTTP: start, read and cancel a job with a key of the execute scope.

Each bad call answers a JSON error naming the field and changes no table; reads are audited
only for a person's key, as that person.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from api.keys import forget_cached
from koala.audit import AuditAction
from koala.models import AuditEvent
from tests.integration.test_command_input import table_state
from tests.support.apikeys import bearer, new_key
from workers.models import Job, JobState
from workers.services.jobs import enqueue

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.web.api_runs_urls")]

CARD = "4111111111111111"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


@pytest.fixture
def machine() -> dict[str, str]:
    return bearer(new_key("execute", name="ci")[1])


def post(client: Client, url: str, body: Any, auth: dict[str, str]) -> Any:
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, raw, content_type="application/json", **auth)


def test_start_read_and_cancel_a_job(client: Client, machine: dict[str, str]) -> None:
    started = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"n": 1}, "delay_seconds": 3600, "priority": 3}, machine)
    assert started.status_code == 201, started.content
    body = started.json()
    assert body["state"] == "queued" and body["created"] is True
    job = Job.objects.get(pk=body["job_id"])
    assert (job.kind, job.input, job.priority) == ("noop", {"n": 1}, 3)
    assert job.created_by.startswith("apikey:")
    again = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"n": 2}, "idempotency_key": "k-1"}, machine)
    repeat = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"n": 2}, "idempotency_key": "k-1"}, machine)
    assert again.status_code == 201 and repeat.status_code == 200
    assert repeat.json()["job_id"] == again.json()["job_id"] and repeat.json()["created"] is False
    clash = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"n": 3}, "idempotency_key": "k-1"}, machine)
    assert clash.status_code == 400 and clash.json()["error"] == "idempotency_conflict"

    read = client.get(f"/api/v1/jobs/{job.pk}", **machine)
    assert read.status_code == 200
    assert read.json()["job_id"] == job.pk and read.json()["input"] == {"n": 1} and read.json()["state"] == "queued"

    cancelled = post(client, f"/api/v1/jobs/{job.pk}/cancel", {"reason": "not needed"}, machine)
    assert cancelled.status_code == 200 and cancelled.json() == {"job_id": job.pk, "state": "cancelled"}
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    event = AuditEvent.objects.get(action=AuditAction.CANCEL)
    assert event.actor.startswith("apikey:") and event.target_id == str(job.pk)
    twice = post(client, f"/api/v1/jobs/{job.pk}/cancel", {}, machine)
    assert twice.status_code == 400 and twice.json()["error"] == "already_finished"


def test_reads_are_redacted_and_audited_only_for_a_persons_key(client: Client, machine: dict[str, str]) -> None:
    get_user_model().objects.create_user("alice")
    job_id = enqueue(kind="boom", input={"card": CARD, "order": "A-1"}, delay_seconds=3600).job_id
    read = client.get(f"/api/v1/jobs/{job_id}", **machine)
    assert read.status_code == 200 and CARD not in read.content.decode()
    assert read.json()["input"]["order"] == "A-1"
    assert not AuditEvent.objects.filter(action=AuditAction.READ).exists(), "a machine key's read is not audited"
    row, raw = new_key("execute", person="alice")
    assert client.get(f"/api/v1/jobs/{job_id}", **bearer(raw)).status_code == 200
    event = AuditEvent.objects.get(action=AuditAction.READ)
    assert (event.actor, event.target_type, event.target_id) == ("alice", "job", str(job_id))
    assert event.details == {"via": "api", "key": row.prefix}


def test_a_persons_key_starts_and_cancels_as_that_person(client: Client) -> None:
    get_user_model().objects.create_user("alice")
    auth = bearer(new_key("write", person="alice")[1])
    job_id = post(client, "/api/v1/jobs", {"kind": "noop", "input": {}, "delay_seconds": 60}, auth).json()["job_id"]
    assert Job.objects.get(pk=job_id).created_by == "alice"
    assert post(client, f"/api/v1/jobs/{job_id}/cancel", {}, auth).status_code == 200
    assert AuditEvent.objects.get(action=AuditAction.CANCEL).actor == "alice"


@pytest.mark.parametrize(
    ("body", "status", "error", "field"),
    [
        ({}, 400, "invalid_request", "kind"),
        ({"kind": ""}, 400, "invalid_request", "kind"),
        ({"kind": 5}, 400, "invalid_request", "kind"),
        ({"kind": "nope"}, 400, "unknown_kind", "kind"),
        ({"kind": "noop", "version": 99}, 400, "invalid_request", "version"),
        ({"kind": "noop", "version": "1"}, 400, "invalid_request", "version"),
        ({"kind": "noop", "version": 0}, 400, "invalid_request", "version"),
        ({"kind": "noop", "input": [1]}, 400, "invalid_request", "input"),
        ({"kind": "noop", "input": {"a": "x" * 20_000}}, 400, "invalid_request", "input"),
        ({"kind": "noop", "input": {"a": "\u0000"}}, 400, "invalid_request", "body.input.a"),
        ({"kind": "noop", "queue": "nope"}, 400, "unknown_queue", "queue"),
        ({"kind": "noop", "queue": ""}, 400, "invalid_request", "queue"),
        ({"kind": "noop", "priority": 40000}, 400, "invalid_request", "priority"),
        ({"kind": "noop", "priority": 1.5}, 400, "invalid_request", "priority"),
        ({"kind": "noop", "delay_seconds": -1}, 400, "invalid_request", "delay_seconds"),
        ({"kind": "noop", "delay_seconds": 1e12}, 400, "invalid_request", "delay_seconds"),
        ({"kind": "noop", "idempotency_key": ""}, 400, "invalid_request", "idempotency_key"),
        ({"kind": "noop", "idempotency_key": "k" * 201}, 400, "invalid_request", "idempotency_key"),
        ({"kind": "noop", "correlation_id": "c" * 65}, 400, "invalid_request", "correlation_id"),
        ({"kind": "noop", "surprise": 1}, 400, "invalid_request", "surprise"),
        ("[1]", 400, "invalid_request", "body"),
        ("{", 400, "invalid_request", "body"),
        ('{"kind": "noop", "delay_seconds": NaN}', 400, "invalid_request", "body"),
        (b"\xff", 400, "invalid_request", "body"),
    ],
)
def test_bad_start_requests_change_nothing(
    client: Client, machine: dict[str, str], body: Any, status: int, error: str, field: str
) -> None:
    before = table_state()
    answer = post(client, "/api/v1/jobs", body, machine)
    assert answer.status_code == status, answer.content
    assert answer.json()["error"] == error
    assert answer.json()["message"].startswith(f"{field}:"), answer.json()
    after = table_state()
    assert {t: v for t, v in after.items() if t != "api_apikey"} == {t: v for t, v in before.items() if t != "api_apikey"}


def test_too_large_body_is_413(client: Client, machine: dict[str, str], settings: Any) -> None:
    settings.KOALA_API_MAX_BODY_BYTES = 100
    answer = post(client, "/api/v1/jobs", {"kind": "noop", "input": {"a": "x" * 200}}, machine)
    assert answer.status_code == 413 and answer.json()["error"] == "too_large"
    assert Job.objects.count() == 0


@pytest.mark.parametrize("scopes", [("worker",)])
def test_a_key_without_execute_is_403_and_changes_nothing(client: Client, scopes: tuple[str, ...]) -> None:
    auth = bearer(new_key(*scopes)[1])
    job_id = enqueue(kind="noop", input={}, delay_seconds=60).job_id
    for answer in (
        post(client, "/api/v1/jobs", {"kind": "noop"}, auth),
        client.get(f"/api/v1/jobs/{job_id}", **auth),
        post(client, f"/api/v1/jobs/{job_id}/cancel", {}, auth),
    ):
        assert answer.status_code == 403
        assert answer.json() == {
            "error": "forbidden",
            "message": "this call needs a key with the 'execute' scope (or 'write' or 'admin'); this key has: worker",
        }
    assert Job.objects.count() == 1 and Job.objects.get().state == JobState.QUEUED
    assert not AuditEvent.objects.exclude(action=AuditAction.API_KEY_CREATED).exists()


@pytest.mark.parametrize(
    "auth", [{}, {"HTTP_AUTHORIZATION": "Bearer kk_0123abcd_" + "A" * 43}, {"HTTP_AUTHORIZATION": "Token x"}]
)
def test_no_valid_key_is_401_json(client: Client, auth: dict[str, str]) -> None:
    job_id = enqueue(kind="noop", input={}, delay_seconds=60).job_id
    for answer in (
        post(client, "/api/v1/jobs", {"kind": "noop"}, auth),
        client.get(f"/api/v1/jobs/{job_id}", **auth),
        post(client, f"/api/v1/jobs/{job_id}/cancel", {}, auth),
    ):
        assert answer.status_code == 401 and answer.json()["error"] == "unauthorized"
    assert Job.objects.count() == 1 and Job.objects.get().state == JobState.QUEUED


def test_unknown_jobs_are_404_json(client: Client, machine: dict[str, str]) -> None:
    for job_id in (999999, 2**63, 10**30):
        read = client.get(f"/api/v1/jobs/{job_id}", **machine)
        cancel = post(client, f"/api/v1/jobs/{job_id}/cancel", {}, machine)
        assert read.status_code == cancel.status_code == 404
        assert read.json()["error"] == cancel.json()["error"] == "not_found"
    assert not AuditEvent.objects.exclude(action=AuditAction.API_KEY_CREATED).exists()


def test_bad_cancel_bodies_change_nothing(client: Client, machine: dict[str, str]) -> None:
    job_id = enqueue(kind="noop", input={}, delay_seconds=60).job_id
    for body, field in (({"reason": 5}, "reason"), ({"reason": "r" * 501}, "reason"), ({"why": "x"}, "why"), ("[]", "body")):
        answer = post(client, f"/api/v1/jobs/{job_id}/cancel", body, machine)
        assert answer.status_code == 400 and answer.json()["message"].startswith(f"{field}:")
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_wrong_methods_are_405_json(client: Client, machine: dict[str, str]) -> None:
    job_id = enqueue(kind="noop", input={}, delay_seconds=60).job_id
    for answer, allowed in (
        (client.get("/api/v1/jobs", **machine), "POST"),
        (client.delete(f"/api/v1/jobs/{job_id}", **machine), "GET"),
        (client.get(f"/api/v1/jobs/{job_id}/cancel", **machine), "POST"),
        (client.put("/api/v1/jobs", "{}", content_type="application/json", **machine), "POST"),
    ):
        assert answer.status_code == 405 and answer.json()["error"] == "method_not_allowed"
        assert answer["Allow"] == allowed
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_no_csrf_token_is_needed(machine: dict[str, str]) -> None:
    strict = Client(enforce_csrf_checks=True)
    assert post(strict, "/api/v1/jobs", {"kind": "noop", "delay_seconds": 60}, machine).status_code == 201
