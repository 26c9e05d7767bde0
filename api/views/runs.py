"""The execute calls: start a job, read one, cancel one (scope ``execute``; docs/worker-api.md).

They parse and call the engine's services and selectors; every refusal is an ApiError answered
as JSON, and a refused call changes nothing. Keys, not cookies: no CSRF token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from functools import wraps
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api import http
from api.http import POOLED, ApiError
from api.keys import KeyScope, Principal, authenticate, require, require_kinds, require_queues
from koala.audit import AuditAction, record_audit
from workers import kinds, targets
from workers.errors import EnqueueError, JobStateError, UnknownName
from workers.models import Job
from workers.selectors.jobs import JobView, job_for_person
from workers.services.jobs import MAX_DELAY_SECONDS, cancel_job, enqueue

log = logging.getLogger("koala.api")
BIGINT_MAX = 2**63 - 1
View = Callable[..., HttpResponse]


def execute_call(*methods: str) -> Callable[[View], View]:
    """The edge of every execute call: the method, the key and its scope, then the view; errors as JSON.

    The view stays a plain function, marked for api/asgi.py, which runs it as one task of the
    hub's thread pool (a kept database connection) instead of a thread of its own per call.
    """

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        def call(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise ApiError(
                        405,
                        "method_not_allowed",
                        f"{request.method} is not allowed here; use {' or '.join(methods)}",
                        headers={"Allow": ", ".join(methods)},
                    )
                principal = authenticate(request.headers.get("Authorization"))
                require(principal, KeyScope.EXECUTE)
                return view(request, principal, *args, **kwargs)
            except ApiError as refused:
                return refused.response()
            except (OperationalError, InterfaceError) as exc:
                # The database is away (a restart, a failover): as the worker calls answer it.
                log.warning("job call %s: database unavailable (%s)", view.__name__, type(exc).__name__)
                return http.unavailable().response()
            except Exception:
                # A JSON answer, never Django's HTML page: a client parses every answer as JSON.
                log.exception("job call %s failed", view.__name__)
                return ApiError(500, "internal_error", "the server failed on this call; it was logged").response()

        setattr(call, POOLED, True)
        return call

    return decorate


def _job_or_404(job_id: int, principal: Principal) -> int:
    """A job this key may see: one of its kinds and queues. Any other is answered exactly like a
    job that does not exist, so a limited key learns nothing about the jobs outside its limits."""
    found = Job.objects.filter(pk=job_id).values_list("kind", "version", "queue").first() if 1 <= job_id <= BIGINT_MAX else None
    if found is None or not principal.allows(kind=found[0], version=found[1], queue=found[2]):
        raise ApiError(404, "not_found", f"no job {job_id}")
    return job_id


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@execute_call("POST")
def start_job(request: HttpRequest, principal: Principal) -> HttpResponse:
    data = http.json_body(request)
    unknown = sorted(
        set(data) - {"kind", "version", "input", "queue", "idempotency_key", "priority", "delay_seconds", "correlation_id"}
    )
    if unknown:
        raise http.invalid(unknown[0], "is not a field of this call")
    kind = http.text(data, "kind", max_length=100)
    version = http.integer(data, "version", minimum=1, maximum=2**31 - 1, default=0) or None
    job_input = http.obj(data, "input") or {}
    queue = http.text(data, "queue", required=False, max_length=64) or None
    if data.get("queue") is not None and queue is None:
        raise http.invalid("queue", "must not be empty")
    key = http.text(data, "idempotency_key", required=False, max_length=200) or None
    if "idempotency_key" in data and data["idempotency_key"] is not None and not (key or "").strip():
        raise http.invalid("idempotency_key", "must not be empty")
    priority = http.integer(data, "priority", minimum=-32768, maximum=32767, default=0)
    delay = http.number(data, "delay_seconds", minimum=0, maximum=MAX_DELAY_SECONDS, default=0.0) or 0.0
    correlation_id = http.text(data, "correlation_id", required=False, max_length=64)
    try:
        contract = kinds.latest(kind)  # unknown kind: its own code, like register's
    except UnknownName as exc:
        raise ApiError(400, "unknown_kind", f"kind: {exc}") from None
    if version is not None:
        found = kinds.get(kind, version)
        if found is None:
            raise http.invalid("version", f"job kind {kind!r} has no version {version} here")
        contract = found
    if queue is not None:
        try:
            targets.check_queue(queue)
        except UnknownName as exc:
            raise ApiError(400, "unknown_queue", f"queue: {exc}") from None  # as register answers it
    # The key's limits, before anything is written: the kind and version the job would run as,
    # and the queue it would wait on.
    require_kinds(principal, [contract.key], field="kind")
    require_queues(principal, [queue or contract.queue], field="queue")
    try:
        result = enqueue(
            kind=kind,
            version=version,
            input=job_input,
            queue=queue,
            idempotency_key=key,
            priority=priority,
            delay_seconds=delay,
            correlation_id=correlation_id,
            created_by=principal.actor,
        )
    except UnknownName as exc:
        raise http.invalid(exc.what, str(exc)) from None
    except EnqueueError as exc:
        message = str(exc)
        if "already used" in message:  # the key names an earlier job with other input
            raise ApiError(400, "idempotency_conflict", f"idempotency_key: {message}") from None
        raise http.invalid("input" if message.startswith("input") else "body", message) from None
    # A new job is queued (sql.JOB_ROW writes 'queued'); only a repeat of an earlier one is read.
    state = "queued" if result.created else Job.objects.values_list("state", flat=True).get(pk=result.job_id)
    return JsonResponse(
        {"job_id": result.job_id, "state": state, "created": result.created}, status=201 if result.created else 200
    )


def _job_json(view: JobView) -> dict[str, Any]:
    job = view.job
    return {
        "job_id": job.pk,
        "kind": job.kind,
        "version": job.version,
        "queue": job.queue,
        "state": job.state,
        "delivery": job.delivery,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "idempotency_key": job.idempotency_key,
        "correlation_id": job.correlation_id,
        "trace_id": job.trace_id,
        "input": view.input,
        "state_data": view.run_state,
        "progress": view.progress,
        "result": view.result,
        "usage": view.usage,
        "cost_minor": view.cost_minor,
        "failure_reason": job.failure_reason,
        "error": view.error or None,
        "park_reason": job.park_reason,
        "park_detail": view.park_detail or None,
        "created_by": job.created_by,
        "scheduled_at": _when(job.scheduled_at),
        "deadline_at": _when(job.deadline_at),
        "created_at": _when(job.created_at),
        "finished_at": _when(job.finished_at),
        "retry_of": job.retry_of_id,
        "retries": view.retries,
        # No lease tokens or holders: those belong to the worker holding the lease.
        "attempt_log": [
            {
                "number": a.attempt.number,
                "worker": a.attempt.worker_id,
                "outcome": a.attempt.outcome,
                "started_at": _when(a.attempt.started_at),
                "finished_at": _when(a.attempt.finished_at),
                "error": a.error or None,
            }
            for a in view.attempts
        ],
    }


@execute_call("GET")
def read_job(request: HttpRequest, principal: Principal, job_id: int) -> HttpResponse:
    job_id = _job_or_404(job_id, principal)
    try:
        view = job_for_person(job_id=job_id, actor=principal.actor, audit=False)
    except Job.DoesNotExist:
        raise ApiError(404, "not_found", f"no job {job_id}") from None
    if principal.person:
        # R19: a person reading run data is audited; a machine key's reads are the machine loop's.
        with transaction.atomic():
            record_audit(
                actor=principal.person,
                action=AuditAction.READ,
                target_type="job",
                target_id=job_id,
                details={"via": "api", "key": principal.prefix},
            )
    return JsonResponse(_job_json(view))


@execute_call("POST")
def cancel(request: HttpRequest, principal: Principal, job_id: int) -> HttpResponse:
    data = http.json_body(request)
    unknown = sorted(set(data) - {"reason"})
    if unknown:
        raise http.invalid(unknown[0], "is not a field of this call")
    reason = http.text(data, "reason", required=False, max_length=500)
    job_id = _job_or_404(job_id, principal)
    try:
        job = cancel_job(job_id=job_id, actor=principal.actor, reason=reason)
    except JobStateError as exc:
        if "does not exist" in str(exc):
            raise ApiError(404, "not_found", f"no job {job_id}") from None
        raise ApiError(400, "already_finished", str(exc)) from None
    return JsonResponse({"job_id": job.pk, "state": job.state})
