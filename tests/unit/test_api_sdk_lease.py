"""The Python SDK reads the contract's answers (docs/worker-api.md) into typed values, and refuses other shapes."""

from __future__ import annotations

import pytest
from koala_worker import (
    AlreadyRecorded,
    ApiError,
    Client,
    JobCancelled,
    Lease,
    LeaseExpired,
    LeaseFormatError,
    LeaseSuperseded,
    Reason,
    Registration,
    Rejected,
    Worker,
)
from koala_worker.client import _answer
from koala_worker.lease import HeartbeatAnswer, parse_leases

LEASE = {
    "lease_id": 9012,
    "lease_token": "v1.9012.3.4f0c",
    "job_id": 771,
    "kind": "send_invoice",
    "version": 2,
    "step": None,
    "queue": "default",
    "input": {"invoice": 55},
    "steps": {},
    "state": {"a": 1},
    "progress": {"page": 3},
    "correlation_id": "corr-1",
    "idempotency_key": "koala-job-771",
    "trace_id": "3f" * 16,
    "span_id": "9a" * 8,
    "attempt": 2,
    "max_attempts": 5,
    "delivery": "at_least_once",
    "expires_at": "2026-12-01T14:00:30+00:00",
    "lease_seconds": 30.0,
    "heartbeat_seconds": 10.0,
    "timeout_seconds": 300.0,
    "deadline_at": None,
}


def test_a_lease_of_the_contract_parses_field_by_field() -> None:
    [lease] = parse_leases({"leases": [LEASE]})
    assert (lease.lease_id, lease.lease_token, lease.job_id) == (9012, "v1.9012.3.4f0c", 771)
    assert (lease.kind, lease.version, lease.step, lease.queue) == ("send_invoice", 2, None, "default")
    assert lease.input == {"invoice": 55}
    assert (lease.state, lease.progress, lease.steps) == ({"a": 1}, {"page": 3}, {})
    assert (lease.idempotency_key, lease.trace_id, lease.span_id) == ("koala-job-771", "3f" * 16, "9a" * 8)
    assert (lease.attempt, lease.max_attempts, lease.delivery) == (2, 5, "at_least_once")
    assert (lease.lease_seconds, lease.heartbeat_seconds, lease.timeout_seconds) == (30.0, 10.0, 300.0)
    assert lease.raw == LEASE


def test_a_lease_without_a_heartbeat_interval_beats_three_times_per_lease() -> None:
    lease = Lease.parse({**LEASE, "heartbeat_seconds": None, "lease_seconds": 12})
    assert lease.heartbeat_seconds == 4.0


@pytest.mark.parametrize(
    "change",
    [
        {"lease_id": "9012"},
        {"lease_id": True},
        {"lease_token": None},
        {"kind": 3},
        {"step": 4},
        {"steps": [1]},
        {"lease_seconds": "30"},
    ],
)
def test_a_lease_of_another_shape_is_refused_by_name(change: dict) -> None:
    with pytest.raises(LeaseFormatError, match=next(iter(change))):
        Lease.parse({**LEASE, **change})


def test_a_lease_missing_its_token_is_refused() -> None:
    raw = dict(LEASE)
    del raw["lease_token"]
    with pytest.raises(LeaseFormatError, match="lease_token"):
        Lease.parse(raw)


def test_an_acquire_answer_must_hold_a_list() -> None:
    with pytest.raises(LeaseFormatError):
        parse_leases({"lease": []})
    assert parse_leases({"leases": []}) == []


def test_registration_and_heartbeat_answers() -> None:
    reg = Registration.parse(
        {"worker_id": "w-1", "lease_seconds": 30, "heartbeat_seconds": 10.0, "poll_seconds": 60.0, "concurrency": 8}
    )
    assert reg == Registration("w-1", 30.0, 10.0, 60.0, 8)
    beat = HeartbeatAnswer.parse({"expires_at": "x", "cancel": True, "reason": "stop_pause"})
    assert (beat.cancel, beat.reason) == (True, "stop_pause")
    assert HeartbeatAnswer.parse({"expires_at": "x", "cancel": False, "reason": None}).cancel is False


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("lease_expired", LeaseExpired),
        ("lease_superseded", LeaseSuperseded),
        ("job_cancelled", JobCancelled),
        ("already_recorded", AlreadyRecorded),
    ],
)
def test_each_409_reason_is_its_own_rejection(reason: str, cls: type[Rejected]) -> None:
    with pytest.raises(cls) as caught:
        _answer("POST", "/x", 409, None, b'{"error": "%s", "message": "m"}' % reason.encode())
    assert caught.value.reason is Reason(reason)
    assert caught.value.message == "m"
    others = {LeaseExpired, LeaseSuperseded, JobCancelled, AlreadyRecorded} - {cls}
    assert not isinstance(caught.value, tuple(others))


def test_other_refusals_are_api_errors_with_status_code_and_message() -> None:
    with pytest.raises(ApiError) as caught:
        _answer("POST", "/x", 429, "3", b'{"error": "concurrency_exceeded", "message": "too many"}')
    assert (caught.value.status, caught.value.code, caught.value.retry_after) == (429, "concurrency_exceeded", 3.0)
    assert caught.value.transient
    with pytest.raises(ApiError) as caught:
        _answer("POST", "/x", 409, None, b'{"error": "conflict", "message": "a reason outside the four"}')
    assert not isinstance(caught.value, Rejected) and caught.value.status == 409
    with pytest.raises(ApiError) as caught:
        _answer("POST", "/x", 502, None, b"<html>bad gateway</html>")
    assert (caught.value.code, caught.value.transient) == ("http_502", True)
    assert "bad gateway" in caught.value.message
    with pytest.raises(ApiError) as caught:
        _answer("POST", "/x", 400, None, b'{"error": "invalid_request", "message": "max: must be 1-8"}')
    assert not caught.value.transient


def test_a_204_answers_no_body() -> None:
    assert _answer("POST", "/x", 204, None, b"") == (204, None)


def _worker() -> Worker:
    return Worker(Client("http://127.0.0.1:9", "k"), concurrency=2)


def test_register_as_a_call_a_decorator_or_a_function_and_what_it_serves() -> None:
    worker = _worker()

    def echo(ctx, value):
        return value

    assert worker.register("echo", 1, echo) is worker
    assert worker.register(echo, version=3) is worker

    @worker.register("pipeline", version=2, steps=("fetch", "store"))
    def pipeline(ctx, value):
        return ctx.step

    assert worker.register("two", 1, steps={"a": echo}) is worker
    assert worker.kinds_payload() == [
        {"name": "echo", "version": 1, "steps": []},
        {"name": "echo", "version": 3, "steps": []},
        {"name": "pipeline", "version": 2, "steps": ["fetch", "store"]},
        {"name": "two", "version": 1, "steps": ["a"]},
    ]
    lease = Lease.parse({**LEASE, "kind": "pipeline", "version": 2, "step": "store"})
    assert worker.body_for(lease) is pipeline
    assert worker.body_for(Lease.parse({**LEASE, "kind": "pipeline", "version": 2, "step": "other"})) is None
    assert worker.body_for(Lease.parse({**LEASE, "kind": "echo", "version": 2})) is None
    assert worker.body_for(Lease.parse({**LEASE, "kind": "two", "version": 1, "step": "a"})) is echo
    assert worker.body_for(Lease.parse({**LEASE, "kind": "two", "version": 1})) is None


def test_a_client_needs_an_http_url() -> None:
    with pytest.raises(ValueError):
        Client("koala:8000", "k")
