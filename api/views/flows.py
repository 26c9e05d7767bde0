"""The run calls: start a workflow run, read one, signal one, cancel one (scope ``execute``).

The same edge as the job calls (``runs.execute_call``: method, key and scope, JSON errors); they
parse and call ``flows.services`` and ``flows.selectors``. Every refusal is an ApiError with a
named code and changes nothing (the services check before they write). A key limited to kinds
and queues reaches only the runs whose every step it could start as a job: a run outside its
limits is answered exactly like a run that does not exist.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from api import http
from api.http import ApiError
from api.keys import Principal, require_kinds, require_queues
from api.views.runs import BIGINT_MAX, execute_call
from flows import errors, services
from flows.models import Run
from flows.selectors import RunView
from koala.redaction import Redactor
from workers import definitions, kinds
from workers.definitions import Workflow


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def flow_error(exc: errors.FlowError) -> ApiError:
    """A core error as the API answers it: its own code, 400 (or 404 for a run that is not there)."""
    message = str(exc)
    match exc:
        case errors.UnknownRun():
            return ApiError(404, "unknown_run", message)
        case errors.UnknownDefinition():
            return ApiError(400, "unknown_definition", message)
        case errors.UnknownVersion():
            return ApiError(400, "unknown_version", message)
        case errors.BadInput():
            return ApiError(400, "bad_input", message)
        case errors.IdempotencyConflict():
            return ApiError(400, "idempotency_conflict", message)
        case errors.SignalTooLarge():
            return ApiError(400, "signal_too_large", message)
        case errors.TooManyPendingSignals():
            return ApiError(400, "too_many_pending_signals", message)
        case errors.BadSignal():
            return ApiError(400, "bad_signal", message)
        case errors.RunFinished():
            return ApiError(400, "run_finished", message)
    return ApiError(400, "bad_input", message)


# -- the key's limits -------------------------------------------------------------------------


def _step_contracts(definition: Workflow) -> tuple[list[str], list[str]]:
    """The "kind@version" pairs and the queues a run of ``definition`` would run its steps as."""
    pairs, queues = [], []
    for step in definition.steps.values():
        if not step.kind:
            continue  # a wait: no job
        pairs.append(f"{step.kind}@{definition.version}")
        contract = kinds.get(step.kind, definition.version)
        if contract is not None:
            queues.append(contract.queue)
    return pairs, sorted(set(queues))


def _allows(principal: Principal, definition: Workflow | None) -> bool:
    if not principal.kinds and not principal.queues:
        return True
    if definition is None:
        return False  # a limited key sees only runs whose steps it can name
    pairs, queues = _step_contracts(definition)
    return all(principal.allows_kind(*_name_version(p)) for p in pairs) and all(principal.allows_queue(q) for q in queues)


def _name_version(pair: str) -> tuple[str, int]:
    name, _, version = pair.rpartition("@")
    return name, int(version)


def _run_or_404(run_id: int, principal: Principal) -> int:
    """A run this key may reach; any other is answered exactly like a run that does not exist."""
    found = Run.objects.filter(pk=run_id).values_list("definition", "version").first() if 1 <= run_id <= BIGINT_MAX else None
    if found is None or not _allows(principal, definitions.get(*found)):
        raise ApiError(404, "unknown_run", f"no run {run_id}")
    return run_id


def _fields(data: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise http.invalid(unknown[0], "is not a field of this call")


# -- the calls ----------------------------------------------------------------------------------


@execute_call("POST")
def start_run(request: HttpRequest, principal: Principal) -> HttpResponse:
    data = http.json_body(request)
    _fields(data, {"definition", "version", "input", "idempotency_key", "correlation_id"})
    name = http.text(data, "definition", max_length=60)
    version = http.integer(data, "version", minimum=1, maximum=2**31 - 1, default=0) or None
    run_input = data.get("input", {})
    if run_input is None:
        run_input = {}
    key = http.text(data, "idempotency_key", required=False, max_length=200) or None
    if "idempotency_key" in data and data["idempotency_key"] is not None and not (key or "").strip():
        raise http.invalid("idempotency_key", "must not be empty")
    correlation_id = http.text(data, "correlation_id", required=False, max_length=64)
    try:
        definition = services.definition_of(name, version)
        # The key's limits, before anything is written: every step's kind and queue.
        pairs, queues = _step_contracts(definition)
        require_kinds(principal, pairs, field="definition")
        require_queues(principal, queues, field="definition")
        started = services.start_run(
            definition=name,
            version=version,
            input=run_input,
            idempotency_key=key,
            actor=principal.actor,
            correlation_id=correlation_id,
        )
    except errors.FlowError as exc:
        raise flow_error(exc) from None
    run = started.run
    return JsonResponse(
        {"run_id": run.pk, "definition": run.definition, "version": run.version, "state": run.state, "created": started.created},
        status=201 if started.created else 200,
    )


def _redactor(view: RunView) -> Redactor:
    """The run's redaction context: every step kind's sensitive fields, over the run's input."""
    definition = definitions.get(view.definition, view.version)
    sensitive: set[str] = set()
    for step in definition.steps.values() if definition else []:
        contract = kinds.get(step.kind, view.version) if step.kind else None
        if contract is not None:
            sensitive |= set(contract.sensitive_fields)
    return Redactor.of(view.input, sensitive=frozenset(sensitive))


def run_json(view: RunView) -> dict[str, Any]:
    shown = _redactor(view)
    return {
        "run_id": view.id,
        "definition": view.definition,
        "version": view.version,
        "state": view.state,
        "input": shown.data(view.input),
        "run_state": shown.data(view.run_state),
        "idempotency_key": view.idempotency_key,
        "correlation_id": view.correlation_id,
        "trace_id": view.trace_id,
        "created_by": view.created_by,
        "error_code": view.error_code or None,
        "error": shown.text(view.error, limit=None) or None,
        "created_at": _when(view.created_at),
        "finished_at": _when(view.finished_at),
        "usage": view.usage,
        "cost_minor": view.cost_minor,
        "steps": [
            {
                "name": step.name,
                "kind": step.kind or None,
                "state": step.state,
                "version": step.version,
                "job_id": step.job_id,
                "output": shown.data(step.output),
                "state_after": shown.data(step.state_after),
                "error_code": step.error_code or None,
                "error": shown.text(step.error, limit=None) or None,
                "wait_event": step.wait_event or None,
                "wait_deadline": _when(step.wait_deadline),
                "due_at": _when(step.due_at),
                "finished_at": _when(step.finished_at),
                "span_id": step.span_id or None,
                "worker_ids": [a.worker_id for a in step.attempts],
                "attempts": [
                    {
                        "number": a.number,
                        "worker": a.worker_id,
                        "outcome": a.outcome,
                        "error": shown.text(f"{a.error_class}: {a.error_message}".strip(": "), limit=None) or None,
                        "started_at": _when(a.started_at),
                        "finished_at": _when(a.finished_at),
                    }
                    for a in step.attempts
                ],
            }
            for step in view.steps
        ],
        "signals": [
            {
                "name": s.name,
                "key": s.key,
                "status": s.status,
                "consumed_by": s.consumed_by or None,
                "created_at": _when(s.created_at),
                "consumed_at": _when(s.consumed_at),
            }
            for s in view.signals
        ],
    }


@execute_call("GET")
def read_run(request: HttpRequest, principal: Principal, run_id: int) -> HttpResponse:
    run_id = _run_or_404(run_id, principal)
    try:
        # Audited (a READ row in the same transaction): a read of a run through the run
        # endpoints is someone reading run data, not the worker loop (which never calls this).
        view = services.read_run(run_id=run_id, actor=principal.actor)
    except errors.FlowError as exc:
        raise flow_error(exc) from None
    return JsonResponse(run_json(view))


@execute_call("POST")
def signal_run(request: HttpRequest, principal: Principal, run_id: int) -> HttpResponse:
    data = http.json_body(request)
    _fields(data, {"name", "key", "payload"})
    # The core names what is wrong with a signal (bad_signal, signal_too_large): passed as given.
    name: Any = data.get("name")
    key: Any = data.get("key")
    run_id = _run_or_404(run_id, principal)
    try:
        answer = services.send_signal(run_id=run_id, name=name, key=key, payload=data.get("payload"), actor=principal.actor)
    except errors.FlowError as exc:
        raise flow_error(exc) from None
    return JsonResponse({"run_id": run_id, "outcome": answer.outcome, "signal_id": answer.signal_id})


@execute_call("POST")
def cancel_run(request: HttpRequest, principal: Principal, run_id: int) -> HttpResponse:
    data = http.json_body(request)
    _fields(data, {"reason"})
    reason = http.text(data, "reason", required=False, max_length=500)
    run_id = _run_or_404(run_id, principal)
    try:
        run = services.cancel_run(run_id=run_id, actor=principal.actor, reason=reason)
    except errors.FlowError as exc:
        raise flow_error(exc) from None
    return JsonResponse({"run_id": run.pk, "state": run.state})
