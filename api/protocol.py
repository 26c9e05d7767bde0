"""The worker protocol's services: register, claim for a waiting worker, heartbeat, complete, fail,
and the ledger's two calls. The views (api.views.worker) parse and call these; nothing here reads
a request.

The same engine as an RQ worker's, not a second one: the claim is ``leases.claim_from`` (pauses in
its SQL, budgets admitted in its transaction), every attempt's end is decided by ``outcomes.decide``
and written by the one transition writer, ``workers.transitions.end_attempt``, and operations go
through ``workers.ledger``. An HTTP worker's attempt therefore ends, retries, parks and is reaped
exactly as an RQ worker's does. What is HTTP's own: the lease token (a secret per lease), the
worker's registration, and the span rows the body reports.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from api.http import ApiError, invalid
from api.keys import Principal, require_serves
from koala import redaction
from workers import definitions, kinds, outcomes, sql, targets, transitions
from workers.context import JobContext
from workers.errors import (
    Declined,
    NotPerformed,
    OutcomeUnknown,
    Park,
    ReconcileLater,
    Rejection,
    Retryable,
    StaleAttempt,
    TerminalFailure,
    UnknownName,
)
from workers.hooks import BodySpan
from workers.ledger import ABSENT, Miss, OperationResult, Processing, run_operation, settle_call
from workers.models import Operation, OperationState, Outcome, WorkerExit, WorkerProcess, operation_key_base
from workers.services import budgets, leases, pauses, processes
from workers.services.leases import ClaimPass, HeldLease, Lease
from workers.spans import SpanError, attempt_span_id, check_attributes
from workers.transitions import Report

NAME_PATTERN = r"[A-Za-z0-9._@+-]{1,200}"  # what django-rq's worker pages can link to (workers.rq_pages)
MAX_CONCURRENCY = 256
MAX_SPANS = 1000  # workers.spans.MAX_SPANS: a report's spans, as an RQ body's are bounded
MAX_SPANS_BYTES = 1_000_000  # their JSON, together
SPAN_FIELDS = frozenset({"span_id", "parent_id", "name", "start", "end", "attributes", "usage", "error"})
MAX_MESSAGE_CHARS = 2000

REJECTION_TEXT = {
    Rejection.LEASE_EXPIRED: "the lease expired before this call and nobody has taken the job since; stop the body",
    Rejection.LEASE_SUPERSEDED: "another attempt has claimed the job since; stop and report nothing for this lease",
    Rejection.JOB_CANCELLED: "an operator cancelled the job; stop at the next safe point and report nothing",
    Rejection.ALREADY_RECORDED: "this report was already recorded (a repeat after a lost reply); treat it as done",
}


def rejected(rejection: Rejection) -> ApiError:
    """HTTP 409 with exactly one of the four reasons (R15)."""
    return ApiError(409, rejection.value, REJECTION_TEXT[rejection])


# -- registration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """What a worker serves, as the claim needs it: "kind@version" pairs, queues, concurrency."""

    worker_id: str
    served: tuple[str, ...]
    queues: tuple[str, ...]
    concurrency: int
    key_prefix: str
    steps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stopping: bool = False  # it called stop while holding leases: it gets no more

    @property
    def signature(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Workers with equal signatures can be served by one claim attempt (api.poller)."""
        return self.queues, self.served


def register(
    *,
    key_prefix: str,
    name: str | None,
    hostname: str,
    pid: int | None,
    served_kinds: Sequence[tuple[str, int, Sequence[str]]],
    queues: Sequence[str] | None,
    concurrency: int,
    sdk: str = "",
    principal: Principal | None = None,
) -> Registration:
    """Record an HTTP worker in the worker-process record and return what it serves.

    Every pair must be a kind Koala knows (its contract lives here); every queue a configured one;
    both within the limits of the key (``principal``). Checked before anything is written.
    Registering again under a name replaces what it serves.
    """
    if not served_kinds:
        raise invalid("kinds", "must name at least one kind")
    pairs: list[str] = []
    steps: dict[str, tuple[str, ...]] = {}
    kind_queues: set[str] = set()
    for kind_name, version, kind_steps in served_kinds:
        kind = kinds.get(kind_name, version)
        if kind is None and definitions.versions(kind_name):
            # A workflow's definition: the steps it names become the kinds it serves.
            for contract, step in _definition_kinds(kind_name, version, kind_steps):
                pairs.append(contract.key)
                steps[contract.key] = (step,)
                kind_queues.add(contract.queue)
            continue
        if kind is None:
            known = sorted(k.key for k in kinds.served())
            raise ApiError(
                400,
                "unknown_kind",
                f"kinds: {kind_name}@{version} is not a kind or workflow Koala knows; known kinds: {', '.join(known)}",
            )
        pairs.append(kind.key)
        steps[kind.key] = tuple(kind_steps)
        kind_queues.add(kind.queue)
    chosen = sorted(set(queues)) if queues else sorted(kind_queues)
    for queue in chosen:
        try:
            targets.check_queue(queue)
        except UnknownName as exc:
            raise ApiError(400, "unknown_queue", f"queues: {exc}") from None
    if principal is not None:
        # What a worker registers is all it ever claims (claim_for): the key's limits hold here.
        require_serves(principal, served=pairs, queues=chosen)
    worker_id = name or f"http.{hostname}.{pid if pid is not None else 0}"
    try:
        processes.start(
            name=worker_id,
            hostname=hostname,
            pid=pid or 0,
            queues=chosen,
            kinds=pairs,
            worker_class=("http " + sdk).strip(),
            owner=key_prefix,
            concurrency=concurrency,
            contracts=kinds.contracts_of(pairs),
        )
    except processes.WorkerNameInUse:
        # Another key's worker (or a worker of the deployment's own) holds the name: refuse rather
        # than let one key act as another's worker.
        raise ApiError(403, "forbidden", f"name: worker {worker_id!r} is registered with another API key") from None
    forget_stopping(worker_id)  # a name that stopped may start again (other server processes hear it: api.poller)
    found = Registration(
        worker_id=worker_id,
        served=tuple(sorted(set(pairs))),
        queues=tuple(chosen),
        concurrency=concurrency,
        key_prefix=key_prefix,
        steps=steps,
    )
    _remember(found)
    return found


def _definition_kinds(name: str, version: int, named: Sequence[str]) -> list[tuple[kinds.JobKind, str]]:
    """The step kinds a worker serving workflow ``name@version`` registers: the steps it names
    (every step a worker can serve when it names none), each a step of that version with a kind
    (a wait is resolved by signals, never by a worker). Named errors otherwise, nothing stored."""
    definition = definitions.get(name, version)
    if definition is None:
        known = ", ".join(map(str, definitions.versions(name)))
        raise ApiError(400, "unknown_version", f"kinds: workflow {name!r} has no version {version} here (versions: {known})")
    servable = {step.name: step for step in definition.steps.values() if step.kind}
    chosen = list(dict.fromkeys(named)) or [step.name for step in servable.values() if step.remote] or list(servable)
    found: list[tuple[kinds.JobKind, str]] = []
    for step_name in chosen:
        step = servable.get(step_name)
        contract = kinds.get(step.kind, version) if step is not None else None
        if step is None or contract is None:
            raise ApiError(
                400,
                "unknown_step",
                f"kinds: {definition.key} has no step {step_name!r} a worker serves (its steps: {', '.join(servable)})",
            )
        found.append((contract, step_name))
    return found


# What this process last read of each worker's row: a hint for the acquire (which queues to probe,
# which waiters look alike), never the authority. Every claim re-reads the row under its lock and
# takes only what the row allows now (leases.claim_for_worker), refreshing or dropping the entry;
# every lease call reads the row (``fresh``). So an idle fleet's acquires cost no query, and what
# another server process changed holds here at the next claim.
_MAX_CACHED = 100_000
_registrations: dict[str, Registration] = {}
_registrations_lock = threading.Lock()


def registration(*, worker_id: str, key_prefix: str, fresh: bool = False) -> Registration:
    """The worker ``worker_id`` registered with key ``key_prefix``, or 404.

    ``fresh``: read from its row (one primary-key read); otherwise this process's last reading of
    it when it has one (the acquire: its claim checks the row again). A worker of another key is
    answered exactly like an unknown one: nothing about another key's workers leaks.
    """
    if not fresh:
        with _registrations_lock:
            cached = _registrations.get(worker_id)
        if cached is not None and cached.key_prefix == key_prefix:
            return cached
    row = WorkerProcess.objects.filter(name=worker_id, stopped_at__isnull=True).exclude(api_key="").first()
    if row is None or row.api_key != key_prefix:
        forget_registration(worker_id)
        raise ApiError(404, "unknown_worker", f"no worker {worker_id!r} is registered with this key; register first")
    found = Registration(
        worker_id=row.name,
        served=tuple(row.kinds),
        queues=tuple(row.queues),
        concurrency=row.concurrency,
        key_prefix=row.api_key,
        stopping=row.stop_requested_at is not None,
    )
    _remember(found)
    return found


def _remember(found: Registration) -> None:
    with _registrations_lock:
        if len(_registrations) >= _MAX_CACHED:
            _registrations.clear()
        _registrations[found.worker_id] = found


def forget_registration(worker_id: str) -> None:
    """Drop this process's reading of a worker (it stopped, or registered again elsewhere)."""
    with _registrations_lock:
        _registrations.pop(worker_id, None)


def touch_workers(*, worker_ids: Sequence[str]) -> int:
    """One UPDATE for every worker seen since the last call (api.poller batches them)."""
    return processes.touch(names=worker_ids)


# Workers that asked to stop while they still held leases (the stop call, below): this process
# answers their acquires at once with nothing. Kept in memory (and told to every server process
# over Redis, api.poller): a worker that stops does not acquire again.
_stopping: set[str] = set()


def forget_stopping(worker_id: str) -> None:
    _stopping.discard(worker_id)


def mark_stopping(worker_id: str) -> None:
    _stopping.add(worker_id)


def is_stopping(worker_id: str) -> bool:
    return worker_id in _stopping


@dataclass(frozen=True)
class Stopped:
    """The stop call's answer: the leases the worker still holds, and whether its exit is recorded."""

    held: int
    exited: bool


def stop(*, worker_id: str, key_prefix: str, reason: str) -> Stopped:
    """A worker stops: it takes no more leases (its waiting acquire is answered at once, by the
    hub), and once it holds none its exit is recorded (stopped, with ``reason``). A worker still
    running bodies calls again when they have ended; one that never does is found silent later
    and recorded as died, as any worker that vanishes."""
    found = registration(worker_id=worker_id, key_prefix=key_prefix, fresh=True)
    mark_stopping(found.worker_id)
    held = count_held(worker_id=found.worker_id)
    if held:
        # In the row, so every server process's claim refuses it (the mark above and the
        # announcement over Redis only end waiting acquires sooner).
        processes.request_stop(name=found.worker_id, owner=key_prefix)
        return Stopped(held=held, exited=False)
    row = WorkerProcess.objects.filter(name=found.worker_id, api_key=key_prefix).values_list("pid", flat=True).first()
    detail = redaction.redact_text(reason or "stop call")
    exited = row is not None and processes.finish(
        name=found.worker_id, pid=row, exit=WorkerExit.STOPPED, detail=detail, owner=key_prefix
    )
    forget_registration(found.worker_id)
    return Stopped(held=0, exited=exited)


# -- leases --------------------------------------------------------------------------------------


def lease_token(*, attempt_id: int, lease_token: int, worker_id: str) -> str:
    """The secret a worker sends with every call about this lease. The fencing token itself is a
    small counter anyone could guess; this one is a MAC of it under the server's SECRET_KEY."""
    mac = hmac.new(
        settings.SECRET_KEY.encode(), f"koala-lease:{attempt_id}:{lease_token}:{worker_id}".encode(), hashlib.sha256
    ).hexdigest()[:40]
    return f"v1.{attempt_id}.{mac}"


def span_id_of(lease: Lease) -> str:
    """The attempt's span (workers.spans.attempt_span_id): stable for the lease, 16 hex like W3C trace context."""
    return attempt_span_id(trace_id=lease.trace_id, job_id=lease.job_id, lease_token=lease.lease_token)


def lease_payload(lease: Lease, *, worker_id: str) -> dict[str, Any]:
    """A lease as the worker receives it (docs/worker-api.md, acquire)."""
    seconds = float(settings.KOALA_LEASE_SECONDS)
    return {
        "lease_id": lease.attempt_id,
        "lease_token": lease_token(attempt_id=lease.attempt_id, lease_token=lease.lease_token, worker_id=worker_id),
        "job_id": lease.job_id,
        "kind": lease.kind,
        "version": lease.version,
        "step": lease.step or None,
        "queue": lease.queue,
        "input": lease.input,
        "steps": lease.steps,
        "state": lease.run_state,
        "run": (
            {"id": lease.run_id, "state": lease.run_state, "correlation_id": lease.correlation_id}
            if lease.run_id is not None
            else None
        ),
        "progress": lease.progress,
        "correlation_id": lease.correlation_id,
        "idempotency_key": _key_base(lease),
        "trace_id": lease.trace_id,
        "span_id": span_id_of(lease),
        "attempt": lease.attempts,
        "max_attempts": lease.max_attempts,
        "delivery": lease.delivery,
        "expires_at": (timezone.now() + timedelta(seconds=seconds)).isoformat(),
        "lease_seconds": seconds,
        "heartbeat_seconds": float(settings.KOALA_HEARTBEAT_SECONDS),
        "timeout_seconds": lease.timeout_seconds,
        "deadline_at": lease.deadline_at.isoformat() if lease.deadline_at else None,
    }


def _key_base(lease: Lease) -> str:
    return operation_key_base(job_id=lease.job_id, idempotency_key=lease.idempotency_key, carried=lease.operation_key_base)


def held_lease(*, lease_id: int, worker_id: str, token: str, key_prefix: str) -> HeldLease:
    """The lease a call names, if the caller may act on it; otherwise 404 (unknown to this key) or
    403 (a token that is not this lease's, or a lease of another worker). Changes nothing."""
    registration(worker_id=worker_id, key_prefix=key_prefix, fresh=True)
    held = leases.lease_of(attempt_id=lease_id) if 0 < lease_id < 2**63 else None
    if held is None:
        raise ApiError(404, "unknown_lease", f"no lease {lease_id}")
    owner = key_prefix if held.worker_id == worker_id else _registration_prefix(held.worker_id)
    if owner != key_prefix:
        raise ApiError(404, "unknown_lease", f"no lease {lease_id}")
    expected = lease_token(attempt_id=lease_id, lease_token=held.lease.lease_token, worker_id=held.worker_id)
    if not hmac.compare_digest(expected.encode(), token.encode()):
        raise ApiError(403, "forbidden", "lease_token: not the token of this lease")
    if held.worker_id != worker_id:
        raise ApiError(403, "forbidden", f"lease {lease_id} is held by another worker")
    return held


def _registration_prefix(worker_id: str) -> str:
    row = WorkerProcess.objects.filter(name=worker_id).values_list("api_key", flat=True).first()
    return row or ""


def count_held(*, worker_id: str) -> int:
    """Leases ``worker_id`` holds now (running jobs it leases)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.COUNT_HELD, [worker_id])
        (count,) = cursor.fetchone()
    return int(count)


def claim_pass() -> ClaimPass:
    """Read once per poller round (as an RQ worker reads one per batch): leases.ClaimPass."""
    return ClaimPass.read()


def claim_for(registration: Registration, *, count: int, state: ClaimPass) -> list[Lease] | leases.WorkerFull | None:
    """Claim up to ``count`` due jobs this worker serves, queue by queue, under pauses and budgets,
    within its row as it is now (kinds, queues, a stop, its concurrency: leases.claim_for_worker),
    whatever this process last read of it. None: the row no longer lets it claim (stopped or asked
    to stop, through any server process). This process's reading is refreshed from the row."""
    row, got = leases.claim_for_worker(
        worker=registration.worker_id,
        owner=registration.key_prefix,
        lease_seconds=float(settings.KOALA_LEASE_SECONDS),
        count=count,
        state=state,
    )
    if row is None:
        forget_registration(registration.worker_id)
        return None
    fresh = Registration(
        worker_id=registration.worker_id,
        served=row.kinds,
        queues=row.queues,
        concurrency=row.concurrency,
        key_prefix=registration.key_prefix,
        steps=registration.steps,
    )
    if fresh != registration:
        _remember(fresh)
    return got


def any_due(*, queues: Sequence[str]) -> bool:
    """Is any job due on these queues? One index probe (job_queued_due_idx): the idle poller's cost."""
    with connection.cursor() as cursor:
        cursor.execute(sql.ANY_DUE, [list(queues)])
        (found,) = cursor.fetchone()
    return bool(found)


def give_back(*, leases_: Sequence[Lease]) -> None:
    """Release leases claimed for a request that is gone (it timed out or disconnected meanwhile):
    never sent, so no body started and no attempt is used."""
    transitions.give_back(leases_, why="released: the acquire request it was claimed for had ended")


# -- heartbeat, complete, fail --------------------------------------------------------------------


def heartbeat(*, held: HeldLease, progress: dict[str, Any] | None) -> dict[str, Any]:
    lease = held.lease
    seconds = float(settings.KOALA_LEASE_SECONDS)
    rejection = leases.heartbeat(job_id=lease.job_id, lease_token=lease.lease_token, lease_seconds=seconds, progress=progress)
    if rejection is not None:
        raise rejected(rejection)
    stop = pauses.stop_requested(kind=lease.kind, queue=lease.queue, tenant=lease.tenant)
    return {
        "expires_at": (timezone.now() + timedelta(seconds=seconds)).isoformat(),
        "cancel": stop,
        "reason": "stop_pause" if stop else None,
    }


def _kind(lease: Lease) -> kinds.JobKind:
    kind = kinds.get(lease.kind, lease.version)
    if kind is None:  # the server no longer knows the kind it leased: a deploy removed it
        raise ApiError(409, Rejection.LEASE_SUPERSEDED.value, f"{lease.kind}@{lease.version} is no longer known here")
    return kind


def _record(held: HeldLease, decision: outcomes.Decision, report: Report | None = None) -> str | None:
    """Write the decision with the one transition writer both runtimes use; a rejection is answered by name."""
    rejection = transitions.end_attempt(decision, held.lease, report)
    # The same one line per attempt outcome an RQ worker logs (its run time from the attempt's
    # start, as this server saw it: the HTTP worker's own clock is not trusted).
    elapsed = max(0.0, (timezone.now() - held.started_at).total_seconds())
    transitions.log_outcome(held.lease, decision, report, elapsed=elapsed, rejection=rejection)
    if rejection is not None:
        raise rejected(rejection)
    return transitions.outcome_of(decision)


def _usage(usage: dict[str, Any] | None, spans: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The step's usage, flat and numeric (summed into the job's): set explicitly, else the sum of
    its spans' own usage, tokens priced from the one price table (ModelPrice)."""
    parts = [usage] if usage is not None else [s["usage"] for s in spans if s.get("usage")]
    total: dict[str, float] = {}
    for part in parts:
        tokens_in = int(part.get("input_tokens") or 0)
        tokens_out = int(part.get("output_tokens") or 0)
        total["input_tokens"] = total.get("input_tokens", 0) + tokens_in
        total["output_tokens"] = total.get("output_tokens", 0) + tokens_out
        cost = part.get("cost_minor")
        if cost is None:
            cost = budgets.price_usage(part)
        if cost is not None:
            total["cost_minor"] = total.get("cost_minor", 0) + int(cost)
        elif part.get("model"):
            total["unpriced_tokens"] = total.get("unpriced_tokens", 0) + tokens_in + tokens_out
    return total


def check_spans(spans: Sequence[Any], *, step_span: str) -> list[dict[str, Any]]:
    """The body's spans, validated (ids, parents within the step, names, times, attributes, usage,
    at most MAX_SPANS of at most MAX_SPANS_BYTES together); 400 naming the first bad field otherwise."""
    if len(spans) > MAX_SPANS:
        raise invalid("spans", f"at most {MAX_SPANS} spans per step")
    size = len(json.dumps(list(spans), default=str))
    if size > MAX_SPANS_BYTES:
        raise invalid("spans", f"{size} bytes of spans; the limit is {MAX_SPANS_BYTES} per report")
    seen = {step_span}
    checked: list[dict[str, Any]] = []
    for index, span in enumerate(spans):
        where = f"spans[{index}]"
        if not isinstance(span, dict):
            raise invalid(where, "must be an object")
        unknown = sorted(set(span) - SPAN_FIELDS)
        if unknown:
            raise invalid(where, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(SPAN_FIELDS))}")
        span_id = span.get("span_id")
        if not isinstance(span_id, str) or len(span_id) != 16 or any(c not in "0123456789abcdef" for c in span_id):
            raise invalid(f"{where}.span_id", "must be 16 lowercase hex characters")
        if span_id == "0" * 16:
            raise invalid(f"{where}.span_id", "must not be all zeros (an invalid span id in W3C trace context)")
        if span_id in seen:
            raise invalid(f"{where}.span_id", "is used twice (or is the step span's)")
        seen.add(span_id)
        checked.append({**span, "span_id": span_id})
    for index, span in enumerate(checked):
        where = f"spans[{index}]"
        parent = span.get("parent_id") or step_span
        if not isinstance(parent, str) or parent not in seen:
            raise invalid(f"{where}.parent_id", "must be the step span or another span of this step")
        name = span.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise invalid(f"{where}.name", "must be a name of 1 to 200 characters")
        for moment in ("start", "end"):
            value = span.get(moment)
            if value is not None and (not isinstance(value, str) or _when(value) is None):
                raise invalid(f"{where}.{moment}", "must be an ISO 8601 time with its offset")
        if span.get("start") and span.get("end") and _when(span["end"]) < _when(span["start"]):  # type: ignore[operator]
            raise invalid(f"{where}.end", "must not be before its start")
        attributes = span.get("attributes")
        if attributes is not None:
            if not isinstance(attributes, dict):
                raise invalid(f"{where}.attributes", "must be an object")
            try:
                check_attributes(attributes, where=f"{where}.attributes")
            except SpanError as exc:
                field, _, problem = str(exc).partition(": ")
                raise invalid(field, problem) from None
        error = span.get("error")
        if error is not None and (not isinstance(error, str) or len(error) > 200):
            raise invalid(f"{where}.error", "must be an error class name of at most 200 characters")
        if span.get("usage") is not None:
            check_usage(span["usage"], where=f"{where}.usage")
        span["parent_id"] = parent
    _no_cycles(checked, step_span=step_span)
    return checked


def _no_cycles(spans: Sequence[dict[str, Any]], *, step_span: str) -> None:
    """Every span's parents lead to the step span (a → b → a would hang under nothing)."""
    parent_of = {span["span_id"]: span["parent_id"] for span in spans}
    for index, span in enumerate(spans):
        at, steps = span["span_id"], 0
        while at != step_span:
            at, steps = parent_of[at], steps + 1
            if steps > len(spans):
                raise invalid(f"spans[{index}].parent_id", "makes a cycle: its parents never reach the step span")


def body_spans(spans: Sequence[dict[str, Any]]) -> tuple[BodySpan, ...]:
    """Checked spans (check_spans) as the engine hands them to its span sinks."""
    return tuple(
        BodySpan(
            span_id=span["span_id"],
            parent_id=span["parent_id"],
            name=span["name"],
            started_at=_when(span["start"]) if span.get("start") else None,
            ended_at=_when(span["end"]) if span.get("end") else None,
            attributes=dict(span.get("attributes") or {}),
            usage=dict(span.get("usage") or {}),
            error=span.get("error") or "",
        )
        for span in spans
    )


def check_usage(usage: Any, *, where: str = "usage") -> dict[str, Any]:
    if not isinstance(usage, dict):
        raise invalid(where, "must be an object")
    allowed = {"model", "input_tokens", "output_tokens", "cost_minor"}
    unknown = sorted(set(usage) - allowed)
    if unknown:
        raise invalid(where, f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")
    model = usage.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > 100):
        raise invalid(f"{where}.model", "must be a model name of at most 100 characters")
    for name in ("input_tokens", "output_tokens", "cost_minor"):
        value = usage.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**15):
            raise invalid(f"{where}.{name}", "must be a whole number between 0 and 10^15")
    return usage


def _when(value: str) -> datetime | None:
    try:
        moment = parse_datetime(value)
    except ValueError:
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def complete(
    *,
    held: HeldLease,
    output: Any,
    state_delta: dict[str, Any],
    usage: dict[str, Any] | None,
    spans: Sequence[dict[str, Any]],
    duration_seconds: float,
) -> str:
    lease = held.lease
    kind = _kind(lease)
    total = _usage(usage, spans)
    redactor = kind.redactor(lease.input)
    with redaction.bind(redactor):
        decision = outcomes.decide(outcomes.Returned(value=output, state_delta=state_delta), lease, kind)
        # The spans go to the span sinks in the completion's own transaction (workers.transitions):
        # stored only if it lands (a stale attempt's spans would describe someone else's outcome).
        report = Report(compute_seconds=duration_seconds, usage=total or None, spans=body_spans(spans))
        outcome = _record(held, decision, report)
    return outcome or Outcome.SUCCEEDED


CLASSIFICATIONS = ("retryable", "step_failure", "fatal", "unservable", "released")


def message_only(text: str) -> str:
    """A failure message as Koala stores it: no stack trace (cut where one starts), bounded."""
    for marker in ("Traceback (most recent call last)", '\n  File "'):
        at = text.find(marker)
        if at != -1:
            text = text[:at].rstrip() or "(a stack trace was sent and dropped)"
    return text[:MAX_MESSAGE_CHARS]


def fail(
    *,
    held: HeldLease,
    classification: str,
    error_class: str,
    message: str,
    retry_after: float | None,
    body_started: bool,
    safe_point: bool,
    spans: Sequence[dict[str, Any]] = (),
) -> str:
    lease = held.lease
    message = message_only(message)
    report = Report(spans=body_spans(spans))
    if classification == "unservable":
        return _record(held, transitions.unservable(lease, worker=held.worker_id)) or Outcome.UNSERVABLE
    kind = _kind(lease)
    ending: outcomes.Ending
    if classification == "released":
        # Not started, or stopped at a checkpoint: nothing is half-done, any delivery is given back.
        # Cut off mid-body: at_most_once fails instead (decide), as at an RQ worker's shutdown.
        ending = (
            outcomes.GivenBack(why="released by the worker (shutdown or stop pause)")
            if (safe_point or not body_started)
            else outcomes.Interrupted(why=outcomes.Cut.SHUTDOWN)
        )
    else:
        named = {
            "retryable": outcomes.Classification.RETRYABLE,
            "step_failure": outcomes.Classification.TERMINAL,
            "fatal": outcomes.Classification.FATAL,
        }[classification]
        label = error_class or {"retryable": "RetryableError", "step_failure": "StepFailure", "fatal": "Error"}[classification]
        ending = outcomes.Reported(classification=named, error_class=label, message=message, retry_after=retry_after)
    with redaction.bind(kind.redactor(lease.input)):
        return _record(held, outcomes.decide(ending, lease, kind), report) or ""


# -- operations: the ledger over HTTP -------------------------------------------------------------


class _HandOff(BaseException):
    """perform() of a step whose call the HTTP worker makes: the row is in flight; stop here."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _LookUp(BaseException):
    """reconcile() of a step whose lookup the HTTP worker makes: ask it, then begin again."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _Runtime:
    """What a JobContext needs from "the process running it": here, the API call in progress."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.shutdown_requested = threading.Event()

    @property
    def lease_seconds(self) -> float:
        return float(settings.KOALA_LEASE_SECONDS)

    def beat(self, ctx: JobContext) -> None:  # a worker elsewhere heartbeats for itself
        return None


def _context(held: HeldLease) -> JobContext:
    return JobContext(held.lease, _kind(held.lease), _Runtime(held.worker_id))


def _lookup_answer(lookup: dict[str, Any]) -> Any:
    """A worker's provider lookup as the ledger's reconcile() answers (workers.ledger)."""
    if "found" in lookup:
        found = lookup["found"] if isinstance(lookup["found"], dict) else {}
        return _result(found)
    if lookup.get("absent") is True:
        return ABSENT
    for name, shape in (("miss", Miss), ("processing", Processing)):
        if name in lookup:
            detail = lookup[name] if isinstance(lookup[name], dict) else {}
            window = detail.get("window_seconds", 0)
            if isinstance(window, bool) or not isinstance(window, int | float) or not 0 <= window <= 86400:
                raise invalid(f"lookup.{name}.window_seconds", "must be a number of seconds between 0 and 86400")
            return shape(window_seconds=float(window))
    if "failed" in lookup:
        retry_after = lookup.get("retry_after")
        raise Retryable(
            str(lookup["failed"])[:MAX_MESSAGE_CHARS], retry_after=retry_after if isinstance(retry_after, int | float) else None
        )
    if lookup.get("unknown") is True:
        return None
    raise invalid("lookup", "must be one of found, absent, miss, processing, failed or unknown")


def _result(found: dict[str, Any]) -> OperationResult:
    data = found.get("data") or {}
    if not isinstance(data, dict):
        raise invalid("data", "must be an object")
    usage = found.get("usage")
    if usage is not None:
        check_usage(usage)
    cost = found.get("cost_minor")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= 10**15):
        raise invalid("cost_minor", "must be a whole number between 0 and 10^15")
    external = found.get("external_id") or ""
    if not isinstance(external, str):
        raise invalid("external_id", "must be a string")
    return OperationResult(external_id=external[:200], data=data, cost_minor=cost, usage=usage)


def _action_for(error: BaseException, held: HeldLease) -> dict[str, Any]:
    """What the worker's body does after the ledger raised ``error``."""
    if isinstance(error, StaleAttempt):
        raise rejected(error.rejection)
    if isinstance(error, Park):
        lease = held.lease
        ending: outcomes.Ending
        if isinstance(error, ReconcileLater):
            ending = outcomes.Reconciling(detail=error.detail, delay_seconds=error.delay_seconds)
        else:
            ending = outcomes.Parked(reason=error.reason, detail=error.detail, parked_on=error.parked_on)
        decision = outcomes.decide(ending, lease, _kind(lease))
        _record(held, decision)
        return {"action": "stop", "reason": error.reason, "message": redaction.current().text(error.detail)}
    if isinstance(error, TerminalFailure):
        # The name an RQ worker's record gives the same failure (outcomes.error_class_of): a declined
        # charge is "TerminalFailure:declined" whichever kind of worker made the call.
        name = outcomes.error_class_of(error)
        return {"action": "raise", "classification": "step_failure", "error_class": name, "message": str(error)}
    if isinstance(error, Retryable):
        return {
            "action": "raise",
            "classification": "retryable",
            "error_class": type(error).__name__,
            "message": str(error),
            "retry_after": error.retry_after,
        }
    return {"action": "raise", "classification": "fatal", "error_class": type(error).__name__, "message": str(error)}


def begin_operation(
    *, held: HeldLease, name: str, options: dict[str, Any], can_look_up: bool, lookup: dict[str, Any] | None
) -> dict[str, Any]:
    """Begin one outbound step of an HTTP worker's body through the same ledger as ctx.operation."""
    ctx = _context(held)
    answer: Any = None
    if lookup is not None:
        try:
            answer = _lookup_answer(lookup)
        except Retryable as failed:  # the lookup itself failed: the ledger asks again later
            answer = failed

    def perform(key: str) -> OperationResult:
        raise _HandOff(key)

    def reconcile(key: str) -> Any:
        if lookup is None:
            raise _LookUp(key)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with redaction.bind(ctx.redactor):
        try:
            result = run_operation(ctx, name, perform=perform, reconcile=reconcile if can_look_up else None, **options)
        except _HandOff as handoff:
            op = Operation.objects.get(key=handoff.key)
            return {"action": "send", "operation_id": op.pk, "key": handoff.key}
        except _LookUp as look:
            op = Operation.objects.get(key=look.key)
            return {"action": "look_up", "operation_id": op.pk, "key": look.key}
        except (Exception, Park) as error:
            return _action_for(error, held)
    return {"action": "done", "result": result}


SETTLE_OUTCOMES = ("succeeded", "not_performed", "declined", "unknown")


def settle_operation(
    *, held: HeldLease, operation_id: int, outcome: str, found: dict[str, Any], message: str, retry_after: float | None
) -> dict[str, Any]:
    """Record what the provider answered to the call ``begin_operation`` handed to the worker."""
    op = Operation.objects.filter(pk=operation_id, job_id=held.lease.job_id).first() if operation_id < 2**63 else None
    if op is None:
        raise ApiError(404, "unknown_operation", f"no operation {operation_id} in this lease's job")
    if op.is_done and op.attempt_id == held.lease.attempt_id:
        return {"action": "done", "result": dict(op.result or {})}
    if op.state != OperationState.IN_FLIGHT or op.lease_token != held.lease.lease_token:
        if op.attempt_id == held.lease.attempt_id:
            raise rejected(Rejection.ALREADY_RECORDED)
        raise rejected(Rejection.LEASE_SUPERSEDED)
    ctx = _context(held)
    result = _result(found) if outcome == "succeeded" else None
    text = message_only(message)

    def perform(key: str) -> OperationResult:
        if outcome == "not_performed":
            raise NotPerformed(text, retry_after=retry_after)
        if outcome == "declined":
            raise Declined(text)
        if outcome == "unknown":
            raise OutcomeUnknown(text)
        assert result is not None
        return result

    with redaction.bind(ctx.redactor):
        try:
            data = settle_call(ctx, operation=op, perform=perform)
        except (Exception, Park) as error:
            return _action_for(error, held)
    return {"action": "done", "result": data, "usage": dict(ctx.counted)}
