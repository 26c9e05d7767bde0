"""The worker protocol against a real uvicorn process, spoken with plain HTTP (no SDK).

Rows are the record: each test asserts on workers_job / workers_attempt / traces_span, and a
refused call is checked to have changed nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from koala.models import AuditEvent
from tests.support.api_server import ApiServer, ProtocolWorker, make_key
from tests.support.fleet import snapshot
from traces.models import Span
from workers.models import Attempt, Job, JobState, Outcome, WorkerProcess
from workers.services import jobs, pauses

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # a uvicorn subprocess


def enqueue(kind: str = "http.probe", version: int = 1, **data: Any) -> int:
    return jobs.enqueue(kind=kind, version=version, input=data).job_id


def test_register_records_the_worker_and_refuses_unknown_kinds(api_server: ApiServer, worker_key: str) -> None:
    status, body = api_server.post(
        "/api/v1/workers/register",
        {"name": "reg-1", "kinds": ["http.probe@1", {"name": "http.probe", "version": 2}], "concurrency": 3},
        key=worker_key,
    )
    assert status == 200, body
    assert body["worker_id"] == "reg-1" and body["concurrency"] == 3
    assert body["lease_seconds"] == 3.0 and body["heartbeat_seconds"] == 0.5
    row = WorkerProcess.objects.get(name="reg-1")
    assert sorted(row.kinds) == ["http.probe@1", "http.probe@2"] and row.concurrency == 3 and row.worker_class.startswith("http")

    before = WorkerProcess.objects.count()
    status, body = api_server.post("/api/v1/workers/register", {"name": "reg-2", "kinds": ["nope@1"]}, key=worker_key)
    assert status == 400 and body["error"] == "unknown_kind" and "nope@1" in body["message"]
    assert WorkerProcess.objects.count() == before


def test_acquire_wakes_on_enqueue_and_complete_records_output_state_usage_and_spans(
    api_server: ApiServer, worker_key: str
) -> None:
    audited = AuditEvent.objects.count()
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-complete")
    got: list[list[dict[str, Any]]] = []
    waiting = threading.Thread(target=lambda: got.append(worker.acquire(1, wait=10)))
    waiting.start()
    time.sleep(0.3)  # the acquire is parked in the hub (nothing is due yet)
    job_id = enqueue(note="hello")
    waiting.join(timeout=10)
    assert got and len(got[0]) == 1
    lease = got[0][0]
    assert lease["job_id"] == job_id and lease["input"] == {"note": "hello"} and lease["attempt"] == 1
    assert len(lease["trace_id"]) == 32 and len(lease["span_id"]) == 16 and lease["steps"] == {}
    assert lease["idempotency_key"] == f"koala-job-{job_id}"

    status, body = worker.lease_call(lease, "heartbeat", progress={"page": 2})
    assert status == 200 and body["cancel"] is False
    assert Job.objects.get(pk=job_id).progress == {"page": 2}

    span = {
        "span_id": "a" * 16,
        "name": "model.call",
        "usage": {"model": "unpriced-model", "input_tokens": 10, "output_tokens": 5},
    }
    child = {"span_id": "b" * 16, "parent_id": "a" * 16, "name": "parse", "usage": {"input_tokens": 1, "output_tokens": 1}}
    status, body = worker.lease_call(lease, "complete", output={"ok": True}, state_delta={"seen": 1}, spans=[span, child])
    assert status == 200 and body == {"outcome": "succeeded"}
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SUCCEEDED and job.result == {"ok": True} and job.run_state == {"seen": 1}
    assert job.usage["input_tokens"] == 11 and job.usage["output_tokens"] == 6
    spans = {s.span_id: s for s in Span.objects.filter(job_id=job_id)}
    assert spans[lease["span_id"]].parent_id == "" and spans["a" * 16].parent_id == lease["span_id"]
    assert spans["b" * 16].parent_id == "a" * 16
    # A machine loop: none of the worker's calls is in the audit log (R19).
    assert AuditEvent.objects.count() == audited

    # The same completion again (a lost reply): already_recorded, and nothing changes.
    before = snapshot(job_id)
    status, body = worker.lease_call(lease, "complete", output={"ok": True})
    assert status == 409 and body["error"] == "already_recorded"
    assert snapshot(job_id) == before


def test_fail_classifications(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-fail")
    job_id = enqueue()
    (lease,) = worker.acquire()
    status, body = worker.lease_call(
        lease, "fail", classification="retryable", error_class="ProviderTimeout", message="slow", retry_after=0
    )
    assert status == 200 and body["outcome"] == Outcome.RETRY
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED and job.error_class == "ProviderTimeout"

    (lease,) = worker.acquire()
    assert lease["attempt"] == 2
    status, body = worker.lease_call(
        lease,
        "fail",
        classification="step_failure",
        error_class="InvalidAccount",
        message="Traceback (most recent call last):\n  x",
    )
    assert status == 200
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.FAILED and job.failure_reason == "terminal" and job.error_class == "InvalidAccount"
    assert "Traceback" not in job.error_message
    # The server logs the one line per attempt outcome an RQ worker logs, for each HTTP ending.
    lines = [line for line in api_server.log().splitlines() if f"job {job_id} (http.probe, attempt " in line]
    assert len(lines) == 2, api_server.log()[-3000:]
    assert "attempt 1, queue default) failed in" in lines[0] and "(ProviderTimeout); retry in" in lines[0]
    assert "attempt 2, queue default) failed in" in lines[1] and ": terminal (InvalidAccount)" in lines[1]


def test_unservable_uses_no_attempt_and_a_worker_with_the_version_serves_it(api_server: ApiServer, worker_key: str) -> None:
    old = ProtocolWorker(api_server, worker_key, kinds=["http.probe@2"], name="w-old")
    job_id = enqueue(version=2)
    (lease,) = old.acquire()
    status, body = old.lease_call(lease, "fail", classification="unservable", message="no body for v2 here")
    assert status == 200 and body["outcome"] == Outcome.UNSERVABLE
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED and job.attempts == 0

    new = ProtocolWorker(api_server, worker_key, kinds=["http.probe@2"], name="w-new")
    (lease,) = new.acquire(wait=5)
    assert lease["job_id"] == job_id and lease["attempt"] == 1
    assert new.lease_call(lease, "complete", output=1)[0] == 200
    assert [a.outcome for a in Attempt.objects.filter(job_id=job_id).order_by("number")] == [
        Outcome.UNSERVABLE,
        Outcome.SUCCEEDED,
    ]


def test_cancel_reaches_the_body_through_the_heartbeat(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-cancel")
    job_id = enqueue()
    (lease,) = worker.acquire()
    jobs.cancel_job(job_id=job_id, actor="operator")
    status, body = worker.lease_call(lease, "heartbeat")
    assert status == 409 and body["error"] == "job_cancelled"
    status, body = worker.lease_call(lease, "complete", output=1)
    assert status == 409 and body["error"] == "job_cancelled"
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED


def test_stop_pause_asks_the_body_to_stop_and_release_gives_it_back(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-pause")
    job_id = enqueue()
    (lease,) = worker.acquire()
    pauses.pause(scope="kind", target="http.probe", mode="stop", reason="incident", actor="operator")
    status, body = worker.lease_call(lease, "heartbeat")
    assert status == 200 and body["cancel"] is True and body["reason"] == "stop_pause"
    status, body = worker.lease_call(lease, "fail", classification="released", safe_point=True)
    assert status == 200 and body["outcome"] == Outcome.INTERRUPTED
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.QUEUED and job.attempts == 0
    assert worker.acquire(wait=1.5) == []  # paused: not handed out


def test_a_lease_of_another_worker_or_a_wrong_token_is_refused_and_changes_nothing(
    api_server: ApiServer, worker_key: str
) -> None:
    mine = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-mine")
    other = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-other")
    job_id = enqueue()
    (lease,) = mine.acquire()
    before = snapshot(job_id)
    status, body = other.lease_call(lease, "complete", output=1)
    assert status == 403 and body["error"] == "forbidden"
    forged = {**lease, "lease_token": lease["lease_token"][:-4] + "0000"}
    status, body = mine.lease_call(forged, "complete", output=1)
    assert status == 403
    status, body = mine.lease_call({**lease, "lease_id": 999999999}, "complete", output=1)
    assert status == 404 and body["error"] == "unknown_lease"
    # Another key sees neither the worker nor the lease.
    stranger = make_key("worker", name="stranger")
    status, body = api_server.post(f"/api/v1/workers/{mine.worker_id}/acquire", {"max": 1, "wait_seconds": 0}, key=stranger)
    assert status == 404
    status, body = api_server.post(
        f"/api/v1/leases/{lease['lease_id']}/complete",
        {"worker_id": mine.worker_id, "lease_token": lease["lease_token"], "output": 1},
        key=stranger,
    )
    assert status == 404
    assert snapshot(job_id) == before


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b'{"worker_id": 5, "lease_token": "x"}', 400),
        (b'{"worker_id": "w", "lease_token": "x", "progress": [1]}', 400),
        (b'{"worker_id": "w\\u0000", "lease_token": "x"}', 400),
        (b'{"worker_id": "w", "lease_token": "x", "n": NaN}', 400),
        (b"{" + b'"a": "' + b"x" * (1024 * 1024 + 10) + b'"}', 413),
    ],
)
def test_bad_input_is_a_json_4xx_and_changes_nothing(api_server: ApiServer, worker_key: str, raw: bytes, status: int) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-bad")
    job_id = enqueue()
    (lease,) = worker.acquire()
    before = snapshot(job_id)
    got, body, _ = api_server.call("POST", f"/api/v1/leases/{lease['lease_id']}/heartbeat", raw=raw, key=worker_key)
    assert got == status and isinstance(body, dict) and body["error"] and body["message"]
    assert snapshot(job_id) == before


def test_keys_and_scopes(api_server: ApiServer, worker_key: str) -> None:
    status, body = api_server.post("/api/v1/workers/register", {"kinds": ["http.probe@1"]})
    assert status == 401 and body["error"] == "unauthorized"
    status, body = api_server.post("/api/v1/workers/register", {"kinds": ["http.probe@1"]}, key="kk_nope_nope")
    assert status == 401
    execute_only = make_key("execute", name="exec")
    status, body = api_server.post("/api/v1/workers/register", {"kinds": ["http.probe@1"]}, key=execute_only)
    assert status == 403 and "worker" in body["message"]
    for fallback in ("write", "admin"):
        status, _ = api_server.post(
            "/api/v1/workers/register",
            {"name": f"w-{fallback}", "kinds": ["http.probe@1"]},
            key=make_key(fallback, name=fallback),
        )
        assert status == 200


def test_concurrency_is_enforced_with_429(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="w-conc", concurrency=1)
    enqueue()
    enqueue()
    (lease,) = worker.acquire()
    status, body, headers = api_server.call(
        "POST", f"/api/v1/workers/{worker.worker_id}/acquire", {"max": 1, "wait_seconds": 2}, key=worker_key
    )
    assert status == 429 and body["error"] == "concurrency_exceeded" and headers.get("retry-after")
    status, body, headers = api_server.call(
        "POST", f"/api/v1/workers/{worker.worker_id}/acquire", {"max": 2, "wait_seconds": 0}, key=worker_key
    )
    assert status == 429
    assert worker.lease_call(lease, "complete", output=1)[0] == 200
    assert len(worker.acquire()) == 1
