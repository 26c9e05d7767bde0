"""api/openapi.json against the live API server (uvicorn in a subprocess): schemathesis's generated
calls, valid and invalid, for every operation, are each answered with a documented status, a JSON
body that matches its schema and no 5xx; then one job through every call, each answer checked the
same way (generated input rarely names a real worker or lease, so the 200s are reached here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.api_server import ApiServer
from tests.support.doc_commands import REPO
from workers.models import Job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # a live server: its connections see the keys

SCHEMA = schemathesis.openapi.from_path(REPO / "api" / "openapi.json")
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES = 20  # per operation and mode: 16 operations x 2 modes x 20 calls stay well under a minute


def auth_for(case: Case, keys: dict[str, str]) -> dict[str, str]:
    """The key of the operation's scope, unless the case is about a missing or wrong key."""
    if case.operation.definition.raw.get("security") == [] or "Authorization" in (case.headers or {}):
        return {}
    return {"Authorization": f"Bearer {keys[case.operation.tags[0] if case.operation.tags else 'worker']}"}


def call(case: Case, base_url: str, keys: dict[str, str]) -> Any:
    headers = auth_for(case, keys)
    response = case.call(base_url=base_url, headers=headers, timeout=30)
    case.validate_response(response, checks=CHECKS, headers=headers)
    return response


def generated(operation: Any, mode: GenerationMode, test: Callable[[Case], None]) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same calls every run: a failure here is reproducible
        phases=[Phase.explicit, Phase.generate],  # no shrinking against a live server: the first failure is reported
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Case) -> None:
        test(case)

    run()


def test_every_generated_call_is_answered_as_the_document_says(api_server: ApiServer, api_keys: dict[str, str]) -> None:
    failures: list[str] = []
    operations = [result.ok() for result in SCHEMA.get_all_operations()]
    assert len(operations) == 16
    for operation in operations:
        # An operation with no parameters and no body (the document itself) has nothing to make invalid.
        negatable = bool(operation.definition.raw.get("parameters") or operation.definition.raw.get("requestBody"))
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if negatable else (GenerationMode.POSITIVE,):
            try:
                generated(operation, mode, lambda case: call(case, api_server.url, api_keys) and None)
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises a FailureGroup; report every operation's
                failures.append(f"{operation.label} ({mode.value}): {str(exc)[:3000]}")
    assert not failures, "\n\n".join(failures)


def op(label: str) -> Any:
    return SCHEMA.find_operation_by_label(label)


def send(label: str, keys: dict[str, str], base_url: str, *, body: Any = None, **path: Any) -> Any:
    operation = op(label)
    case = (
        operation.Case(path_parameters=path or None, body=body, media_type="application/json")
        if body is not None
        else operation.Case(path_parameters=path or None)
    )
    return call(case, base_url, keys)


def test_one_job_through_every_call_is_answered_as_the_document_says(api_server: ApiServer, api_keys: dict[str, str]) -> None:
    url = api_server.url
    worker = "spec-worker"

    def go(label: str, status: int, *, body: Any = None, **path: Any) -> Any:
        response = send(label, api_keys, url, body=body, **path)
        assert response.status_code == status, (label, response.status_code, response.text[:500])
        return response.json() if response.content else None

    registered = go(
        "POST /api/v1/workers/register", 200, body={"name": worker, "kinds": [{"name": "noop", "version": 1}], "concurrency": 1}
    )
    assert registered["worker_id"] == worker and registered["concurrency"] == 1
    started = go("POST /api/v1/jobs", 201, body={"kind": "noop", "input": {"n": 1}, "idempotency_key": "spec-1"})
    again = go("POST /api/v1/jobs", 200, body={"kind": "noop", "input": {"n": 1}, "idempotency_key": "spec-1"})
    assert (again["job_id"], again["created"]) == (started["job_id"], False)
    assert (
        go("POST /api/v1/jobs", 400, body={"kind": "noop", "input": {"n": 2}, "idempotency_key": "spec-1"})["error"]
        == "idempotency_conflict"
    )
    assert go("GET /api/v1/jobs/{job_id}", 200, job_id=started["job_id"])["state"] == "queued"

    too_many = send(
        "POST /api/v1/workers/{worker_id}/acquire", api_keys, url, body={"max": 2, "wait_seconds": 0}, worker_id=worker
    )
    assert (too_many.status_code, too_many.json()["error"]) == (429, "concurrency_exceeded"), too_many.headers
    assert int(too_many.headers["retry-after"][0]) >= 0  # schemathesis keeps headers lower-cased, as lists
    [lease] = go("POST /api/v1/workers/{worker_id}/acquire", 200, body={"max": 1, "wait_seconds": 10}, worker_id=worker)["leases"]
    assert (lease["job_id"], lease["input"], lease["attempt"]) == (started["job_id"], {"n": 1}, 1)
    held = {"worker_id": worker, "lease_token": lease["lease_token"]}
    lease_id = lease["lease_id"]

    beat = go("POST /api/v1/leases/{lease_id}/heartbeat", 200, body={**held, "progress": {"page": 1}}, lease_id=lease_id)
    assert beat["cancel"] is False
    begun = go(
        "POST /api/v1/leases/{lease_id}/operations",
        200,
        body={**held, "name": "notify", "kind": "notify", "params": {"to": "c_1"}, "target": "c_1", "can_look_up": False},
        lease_id=lease_id,
    )
    assert begun["action"] == "send", begun
    settled = go(
        "POST /api/v1/leases/{lease_id}/operations/{operation_id}",
        200,
        body={**held, "outcome": "succeeded", "external_id": "n_1", "data": {"sent": True}},
        lease_id=lease_id,
        operation_id=begun["operation_id"],
    )
    assert settled["action"] == "done", settled
    assert go("POST /api/v1/leases/{lease_id}/complete", 200, body={**held, "output": {"sent": True}}, lease_id=lease_id) == {
        "outcome": "succeeded"
    }
    repeat = go("POST /api/v1/leases/{lease_id}/complete", 409, body={**held, "output": {"sent": True}}, lease_id=lease_id)
    assert repeat["error"] == "already_recorded"
    late = go(
        "POST /api/v1/leases/{lease_id}/fail",
        409,
        body={**held, "classification": "retryable", "message": "late"},
        lease_id=lease_id,
    )
    assert late["error"] in {"already_recorded", "lease_superseded", "lease_expired"}
    assert Job.objects.get(pk=started["job_id"]).state == "succeeded"

    assert go("POST /api/v1/workers/{worker_id}/acquire", 204, body={"max": 1, "wait_seconds": 0}, worker_id=worker) is None
    assert go("POST /api/v1/jobs/{job_id}/cancel", 400, body={}, job_id=started["job_id"])["error"] == "already_finished"
    other = go("POST /api/v1/jobs", 201, body={"kind": "noop", "delay_seconds": 3600})
    assert go("POST /api/v1/jobs/{job_id}/cancel", 200, body={"reason": "spec test"}, job_id=other["job_id"]) == {
        "job_id": other["job_id"],
        "state": "cancelled",
    }


def test_one_run_through_every_run_call_is_answered_as_the_document_says(api_server: ApiServer, api_keys: dict[str, str]) -> None:
    url = api_server.url

    def go(label: str, status: int, *, body: Any = None, **path: Any) -> Any:
        response = send(label, api_keys, url, body=body, **path)
        assert response.status_code == status, (label, response.status_code, response.text[:500])
        return response.json() if response.content else None

    body = {"definition": "http_hello", "input": {"name": "Ada"}, "idempotency_key": "spec-run-1"}
    started = go("POST /api/v1/runs", 201, body=body)
    assert (started["definition"], started["version"], started["created"]) == ("http_hello", 1, True)
    assert go("POST /api/v1/runs", 200, body=body)["run_id"] == started["run_id"]
    clash = go("POST /api/v1/runs", 400, body={**body, "input": {"name": "Bob"}})
    assert clash["error"] == "idempotency_conflict"
    assert go("POST /api/v1/runs", 400, body={"definition": "http_hello", "input": {}})["error"] == "bad_input"
    assert go("POST /api/v1/runs", 400, body={"definition": "nope"})["error"] == "unknown_definition"
    assert go("POST /api/v1/runs", 400, body={"definition": "http_hello", "version": 99})["error"] == "unknown_version"
    run_id = started["run_id"]
    shown = go("GET /api/v1/runs/{run_id}", 200, run_id=run_id)
    assert [step["name"] for step in shown["steps"]] == ["greet", "shout"] and shown["steps"][0]["state"] == "queued"
    signal = {"name": "note", "key": "n-1", "payload": {"x": 1}}
    assert go("POST /api/v1/runs/{run_id}/signals", 200, body=signal, run_id=run_id)["outcome"] == "buffered"
    assert go("POST /api/v1/runs/{run_id}/signals", 200, body=signal, run_id=run_id)["outcome"] == "duplicate"
    big = {"name": "note", "key": "n-2", "payload": {"x": "y" * 20_000}}
    assert go("POST /api/v1/runs/{run_id}/signals", 400, body=big, run_id=run_id)["error"] == "signal_too_large"
    assert go("POST /api/v1/runs/{run_id}/cancel", 200, body={"reason": "spec"}, run_id=run_id) == {
        "run_id": run_id,
        "state": "cancelled",
    }
    assert go("POST /api/v1/runs/{run_id}/cancel", 400, body={}, run_id=run_id)["error"] == "run_finished"
    late = {"name": "note", "key": "n-3"}
    assert go("POST /api/v1/runs/{run_id}/signals", 200, body=late, run_id=run_id)["outcome"] == "rejected"
    assert go("GET /api/v1/runs/{run_id}", 404, run_id=run_id + 1000)["error"] == "unknown_run"


def test_every_path_answers_another_method_with_a_json_405(api_server: ApiServer, api_keys: dict[str, str]) -> None:
    for path, item in SCHEMA.raw_schema["paths"].items():
        [tag] = {t for operation in item.values() for t in operation["tags"]}
        key = {"Authorization": f"Bearer {api_keys[tag]}"} if tag in api_keys else {}  # the method is refused, not the key
        concrete = (
            path.replace("{worker_id}", "w")
            .replace("{lease_id}", "1")
            .replace("{operation_id}", "1")
            .replace("{job_id}", "1")
            .replace("{run_id}", "1")
        )
        for method in {"GET", "POST", "PUT", "DELETE"} - {m.upper() for m in item}:
            answer = requests.request(method, api_server.url + concrete, headers=key, timeout=30)
            assert answer.status_code == 405, (method, path, answer.status_code)
            assert answer.headers["Content-Type"] == "application/json", (method, path)
            assert set(json.loads(answer.content)) == {"error", "message"}, (method, path)


@pytest.fixture
def api_keys(worker_key: str, execute_key: str) -> dict[str, str]:
    """A machine key per scope, by the tag the document gives each operation."""
    return {"worker": worker_key, "execute": execute_key}
