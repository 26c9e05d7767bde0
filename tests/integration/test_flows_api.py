"""The run calls over HTTP (api/views/flows.py): start, read, signal and cancel a workflow run with
a key of the execute scope. Every bad call answers its named error and changes no table (counted
and hashed before and after); a read is audited; a key's kind and queue limits hold for runs.

``hwait`` (tests/flows_kinds.py): a remote step ``work``, a wait for ``go``, a remote ``finish``;
no worker runs here, so a run stays on ``work`` while the calls are made.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from api.keys import forget_cached
from flows.models import Run, RunStep, Signal
from koala.audit import AuditAction
from koala.models import AuditEvent
from tests.integration import test_command_input
from tests.support.apikeys import bearer, new_key
from workers.definitions import MAX_SIGNAL_PAYLOAD_BYTES
from workers.models import Job, JobState

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.web.api_runs_urls")]


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    forget_cached()
    yield
    forget_cached()


@pytest.fixture
def machine() -> dict[str, str]:
    return bearer(new_key("execute", name="ci")[1])


def table_state() -> dict[str, Any]:
    """Every table's row count and row hash, but the keys' (a call moves its key's last_used_at)."""
    return {t: v for t, v in test_command_input.table_state().items() if t != "api_apikey"}


def post(client: Client, url: str, body: Any, auth: dict[str, str]) -> Any:
    raw = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, raw, content_type="application/json", **auth)


def start(client: Client, auth: dict[str, str], **fields: Any) -> Any:
    return post(client, "/api/v1/runs", {"definition": "hwait", "input": {"log": "/dev/null"}, **fields}, auth)


def test_start_read_and_the_same_key_again(client: Client, machine: dict[str, str]) -> None:
    started = start(client, machine, idempotency_key="ticket-1", correlation_id="req-9")
    assert started.status_code == 201, started.content
    body = started.json()
    assert body["state"] == "running" and body["created"] is True and (body["definition"], body["version"]) == ("hwait", 1)
    run = Run.objects.get(pk=body["run_id"])
    assert run.created_by.startswith("apikey:") and run.correlation_id == "req-9"
    work = RunStep.objects.get(run=run, name="work")
    assert work.state == "queued" and Job.objects.get(pk=work.job_id).state == JobState.QUEUED
    again = start(client, machine, idempotency_key="ticket-1", correlation_id="req-9")
    assert again.status_code == 200 and again.json()["run_id"] == run.pk and again.json()["created"] is False
    before = table_state()
    clash = post(
        client, "/api/v1/runs", {"definition": "hwait", "input": {"log": "/other"}, "idempotency_key": "ticket-1"}, machine
    )
    assert clash.status_code == 400 and clash.json()["error"] == "idempotency_conflict", clash.content
    assert "ticket-1" in clash.json()["message"]
    assert table_state() == before

    reads = AuditEvent.objects.filter(action=AuditAction.READ, target_type="run", target_id=str(run.pk))
    assert reads.count() == 0
    read = client.get(f"/api/v1/runs/{run.pk}", **machine)
    assert read.status_code == 200, read.content
    shown = read.json()
    assert (shown["run_id"], shown["state"], shown["version"], shown["run_state"]) == (run.pk, "running", 1, {})
    assert [s["name"] for s in shown["steps"]] == ["work", "gate", "finish"]
    assert shown["steps"][0]["state"] == "queued" and shown["steps"][0]["job_id"] == work.job_id
    assert shown["steps"][0]["worker_ids"] == [] and shown["steps"][1]["wait_event"] == "go"
    assert shown["trace_id"] == run.trace_id and shown["input"] == {"log": "/dev/null"}
    # A read through the run endpoints is audited, as the key's actor.
    assert reads.count() == 1 and reads.get().actor == run.created_by


BAD_STARTS: list[tuple[Any, int, str, str]] = [
    ({"definition": "nope", "input": {}}, 400, "unknown_definition", "nope"),
    ({"definition": "hwait", "version": 9, "input": {"log": "x"}}, 400, "unknown_version", "9"),
    ({"definition": "hwait", "input": [1, 2]}, 400, "bad_input", "JSON object"),
    ({"definition": "hwait", "input": "text"}, 400, "bad_input", "JSON object"),
    ({"definition": "hwait", "input": {}}, 400, "bad_input", "log"),
    ({"definition": "hwait", "input": {"log": "x" * 20_000}}, 400, "bad_input", "limit"),
    ({"definition": "hwait", "input": {"log": "x"}, "idempotency_key": "   "}, 400, "invalid_request", "idempotency_key"),
    ({"definition": "hwait", "input": {"log": "x"}, "idempotency_key": "k" * 201}, 400, "invalid_request", "idempotency_key"),
    ({"definition": "hwait", "version": 0, "input": {"log": "x"}}, 400, "invalid_request", "version"),
    ({"definition": "hwait", "version": "1", "input": {"log": "x"}}, 400, "invalid_request", "version"),
    ({"definition": 7, "input": {}}, 400, "invalid_request", "definition"),
    ({"input": {}}, 400, "invalid_request", "definition"),
    ({"definition": "hwait", "input": {"log": "x"}, "queue": "default"}, 400, "invalid_request", "queue"),
    ("[1]", 400, "invalid_request", "body"),
    ("{not json", 400, "invalid_request", "body"),
]


@pytest.mark.parametrize(("body", "status", "code", "named"), BAD_STARTS)
def test_a_bad_start_answers_its_named_error_and_changes_nothing(
    client: Client, machine: dict[str, str], body: Any, status: int, code: str, named: str
) -> None:
    before = table_state()
    answer = post(client, "/api/v1/runs", body, machine)
    assert (answer.status_code, answer.json()["error"]) == (status, code), answer.content
    assert named in answer.json()["message"]
    assert table_state() == before


def test_signals_buffered_duplicate_and_the_bad_ones(client: Client, machine: dict[str, str]) -> None:
    run_id = start(client, machine).json()["run_id"]
    url = f"/api/v1/runs/{run_id}/signals"
    first = post(client, url, {"name": "go", "key": "r-1", "payload": {"ok": True}}, machine)
    assert first.status_code == 200 and first.json()["outcome"] == "buffered", first.content
    signal_id = first.json()["signal_id"]
    assert Signal.objects.get(pk=signal_id).status == "buffered"  # no wait yet: kept for it
    repeat = post(client, url, {"name": "go", "key": "r-1", "payload": {"other": 1}}, machine)
    assert repeat.json() == {"run_id": run_id, "outcome": "duplicate", "signal_id": signal_id}
    bad: list[tuple[str, Any, int, str]] = [
        (url, {"name": "go", "key": "r-2", "payload": {"blob": "x" * (MAX_SIGNAL_PAYLOAD_BYTES + 1)}}, 400, "signal_too_large"),
        (url, {"name": "", "key": "r-3"}, 400, "bad_signal"),
        (url, {"name": "go"}, 400, "bad_signal"),
        (url, {"name": "go", "key": "r-4", "payload": [1]}, 400, "bad_signal"),
        (url, {"name": "go", "key": "r-5", "extra": 1}, 400, "invalid_request"),
        (f"/api/v1/runs/{run_id + 1000}/signals", {"name": "go", "key": "r-6"}, 404, "unknown_run"),
    ]
    before = table_state()
    for where, body, status, code in bad:
        answer = post(client, where, body, machine)
        assert (answer.status_code, answer.json()["error"]) == (status, code), (body, answer.content)
    assert table_state() == before


def test_too_many_pending_signals(client: Client, machine: dict[str, str], settings: Any) -> None:
    from workers.definitions import MAX_PENDING_SIGNALS

    run_id = start(client, machine).json()["run_id"]
    run = Run.objects.get(pk=run_id)
    Signal.objects.bulk_create([Signal(run=run, name="other", key=f"k{n}") for n in range(MAX_PENDING_SIGNALS)])
    before = table_state()
    answer = post(client, f"/api/v1/runs/{run_id}/signals", {"name": "go", "key": "one-more"}, machine)
    assert (answer.status_code, answer.json()["error"]) == (400, "too_many_pending_signals"), answer.content
    assert table_state() == before


def test_cancel_then_a_finished_run_rejects_signals_and_a_second_cancel(
    client: Client, machine: dict[str, str], django_capture_on_commit_callbacks: Any
) -> None:
    run_id = start(client, machine).json()["run_id"]
    job_id = RunStep.objects.get(run_id=run_id, name="work").job_id
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = post(client, f"/api/v1/runs/{run_id}/cancel", {"reason": "customer withdrew"}, machine)
    assert cancelled.status_code == 200 and cancelled.json() == {"run_id": run_id, "state": "cancelled"}
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED  # its queued step's job (after the commit)
    before = table_state()
    again = post(client, f"/api/v1/runs/{run_id}/cancel", {}, machine)
    assert (again.status_code, again.json()["error"]) == (400, "run_finished")
    late = post(client, f"/api/v1/runs/{run_id}/signals", {"name": "go", "key": "late"}, machine)
    assert late.status_code == 200 and late.json()["outcome"] == "rejected"
    missing = post(client, "/api/v1/runs/999999/cancel", {}, machine)
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown_run")
    assert client.get("/api/v1/runs/999999", **machine).json()["error"] == "unknown_run"
    assert table_state() == before


def test_the_scope_and_the_keys_limits(client: Client) -> None:
    worker_only = bearer(new_key("worker", name="workers")[1])
    before = table_state()
    refused = start(client, worker_only)
    assert (refused.status_code, refused.json()["error"]) == (403, "forbidden") and "execute" in refused.json()["message"]
    assert table_state() == before
    # A key limited to kinds starts only definitions whose every step it names.
    steps_key = bearer(new_key("execute", name="hwait runs", kinds=["hwait.work", "hwait.finish@1"])[1])
    echo_key = bearer(new_key("execute", name="echo runs", kinds=["http.echo"])[1])
    run_id = start(client, steps_key).json()["run_id"]
    before = table_state()
    outside = start(client, echo_key)
    assert (outside.status_code, outside.json()["error"]) == (403, "forbidden") and "definition" in outside.json()["message"]
    # A run outside the key's limits is answered as a run that does not exist.
    for answer in (
        client.get(f"/api/v1/runs/{run_id}", **echo_key),
        post(client, f"/api/v1/runs/{run_id}/signals", {"name": "go", "key": "x"}, echo_key),
        post(client, f"/api/v1/runs/{run_id}/cancel", {}, echo_key),
    ):
        assert (answer.status_code, answer.json()["error"]) == (404, "unknown_run"), answer.content
    assert table_state() == before
    assert client.get(f"/api/v1/runs/{run_id}", **steps_key).status_code == 200
