"""The protocol's answers as typed values (docs/worker-api.md, sections 1-3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class LeaseFormatError(ValueError):
    """An answer that does not have the shape the contract gives it."""


def _need(raw: dict[str, Any], name: str, kind: Any) -> Any:
    if name not in raw:
        raise LeaseFormatError(f"the answer has no {name!r}")
    value = raw[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise LeaseFormatError(f"{name!r} has the wrong type ({type(value).__name__})")
    return value


def _dict(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LeaseFormatError(f"{name!r} must be an object")
    return value


def _float(raw: dict[str, Any], name: str, default: float | None) -> float | None:
    value = raw.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LeaseFormatError(f"{name!r} must be a number")
    return float(value)


@dataclass(frozen=True)
class Registration:
    worker_id: str
    lease_seconds: float
    heartbeat_seconds: float
    poll_seconds: float
    concurrency: int

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Registration:
        return cls(
            worker_id=_need(raw, "worker_id", str),
            lease_seconds=float(_need(raw, "lease_seconds", int | float)),
            heartbeat_seconds=float(_need(raw, "heartbeat_seconds", int | float)),
            poll_seconds=float(_need(raw, "poll_seconds", int | float)),
            concurrency=int(_need(raw, "concurrency", int)),
        )


@dataclass(frozen=True)
class Lease:
    """One attempt of one step, held by this worker until ``expires_at`` (extended by heartbeats)."""

    lease_id: int
    lease_token: str
    job_id: int
    kind: str
    version: int
    step: str | None
    queue: str
    input: Any
    steps: dict[str, Any]
    state: dict[str, Any]
    run: dict[str, Any] | None
    progress: dict[str, Any]
    correlation_id: str
    idempotency_key: str
    trace_id: str
    span_id: str
    attempt: int
    max_attempts: int | None
    delivery: str
    expires_at: str
    lease_seconds: float
    heartbeat_seconds: float
    timeout_seconds: float | None
    deadline_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def parse(cls, raw: Any) -> Lease:
        if not isinstance(raw, dict):
            raise LeaseFormatError("a lease must be an object")
        step = raw.get("step")
        if step is not None and not isinstance(step, str):
            raise LeaseFormatError("'step' must be a string or null")
        max_attempts = raw.get("max_attempts")
        lease_seconds = _float(raw, "lease_seconds", 30.0)
        heartbeat_seconds = _float(raw, "heartbeat_seconds", None)
        assert lease_seconds is not None
        return cls(
            lease_id=_need(raw, "lease_id", int),
            lease_token=_need(raw, "lease_token", str),
            job_id=_need(raw, "job_id", int),
            kind=_need(raw, "kind", str),
            version=_need(raw, "version", int),
            step=step,
            queue=str(raw.get("queue") or ""),
            input=raw.get("input"),
            steps=_dict(raw, "steps"),
            state=_dict(raw, "state"),
            run=_dict(raw, "run") or None,
            progress=_dict(raw, "progress"),
            correlation_id=str(raw.get("correlation_id") or ""),
            idempotency_key=str(raw.get("idempotency_key") or ""),
            trace_id=str(raw.get("trace_id") or ""),
            span_id=str(raw.get("span_id") or ""),
            attempt=int(raw.get("attempt") or 1),
            max_attempts=int(max_attempts) if isinstance(max_attempts, int) else None,
            delivery=str(raw.get("delivery") or ""),
            expires_at=str(raw.get("expires_at") or ""),
            lease_seconds=lease_seconds,
            # Without one, beat three times per lease (the contract's default is lease / 3).
            heartbeat_seconds=heartbeat_seconds if heartbeat_seconds else lease_seconds / 3,
            timeout_seconds=_float(raw, "timeout_seconds", None),
            deadline_at=raw.get("deadline_at") if isinstance(raw.get("deadline_at"), str) else None,
            raw=raw,
        )


def parse_leases(answer: Any) -> list[Lease]:
    """The leases of an acquire answer (``200 {"leases": [...]}``)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("leases"), list):
        raise LeaseFormatError("an acquire answer must be {'leases': [...]}")
    return [Lease.parse(item) for item in answer["leases"]]


@dataclass(frozen=True)
class HeartbeatAnswer:
    expires_at: str
    cancel: bool
    reason: str | None

    @classmethod
    def parse(cls, raw: Any) -> HeartbeatAnswer:
        if not isinstance(raw, dict):
            raise LeaseFormatError("a heartbeat answer must be an object")
        reason = raw.get("reason")
        return cls(
            expires_at=str(raw.get("expires_at") or ""),
            cancel=bool(raw.get("cancel")),
            reason=reason if isinstance(reason, str) else None,
        )


@dataclass(frozen=True)
class StopAnswer:
    """The stop call's answer: the leases the worker still holds, and whether its exit is recorded."""

    held: int
    exited: bool
