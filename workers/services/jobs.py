"""Job lifecycle services used by people and code: enqueue, cancel, retry, requeue."""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from koala.storable import column_length, json_problem, text_problem
from workers import doorbell, hooks, kinds, sql, targets, transitions
from workers.errors import EnqueueError, JobStateError
from workers.models import DONE_OPERATION_STATES, Attempt, Job, JobState, Operation, Outcome, operation_key_base

MAX_DELAY_SECONDS = 10 * 366 * 86_400.0  # ten years: anything later is a mistake, not a schedule
_TEXT_LIMITS = {name: column_length(Job, name) for name in ("idempotency_key", "correlation_id", "created_by")}


@dataclass(frozen=True)
class JobSpec:
    kind: str
    input: Mapping[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    version: int | None = None
    queue: str | None = None
    priority: int = 0
    delay_seconds: float = 0.0
    correlation_id: str = ""
    # A workflow's step (the flows app enqueues these; docs/engine.md): the run's id, the step's
    # name, its parents' outputs by name, the run's state as the step became due, the run's trace
    # id (shared by its steps; a spec naming one needs no other spec of the batch to share it)
    # and the operation key base stable across the step's retries and version moves.
    run_id: int | None = None
    step: str = ""
    steps: Mapping[str, Any] = field(default_factory=dict)
    run_state: Mapping[str, Any] = field(default_factory=dict)
    trace_id: str = ""
    operation_key_base: str = ""


@dataclass(frozen=True)
class EnqueueResult:
    job_id: int
    created: bool  # False: an earlier job with the same key and input was returned


def input_fingerprint(kind: str, version: int, data: Mapping[str, Any]) -> str:
    canonical = json.dumps({"k": kind, "v": version, "i": data}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _validated(spec: JobSpec, *, created_by: str = "") -> tuple[kinds.JobKind, str, str, str]:
    """The kind, input fingerprint, encoded input and queue of a spec, or EnqueueError saying why not."""
    if spec.version is None:
        kind = kinds.latest(spec.kind)
    else:
        found = kinds.get(spec.kind, spec.version)
        if found is None:
            kinds.latest(spec.kind)  # raises "unknown kind" when no version exists at all
            raise EnqueueError(f"job kind {spec.kind!r} has no version {spec.version} in this process.")
        kind = found
    from workers import definitions  # it builds on this module (its handles enqueue through it)

    if spec.run_id is None and definitions.is_step_kind(kind.name):
        # A step's job belongs to its run (flows): alone it would run with no parents and no state,
        # and nothing would hang on its end.
        workflow, _, step = kind.name.rpartition(".")
        raise EnqueueError(
            f"job kind {kind.name!r} is step {step!r} of workflow {workflow}; start a run of the workflow instead "
            "(POST /api/v1/runs, koala_flow start)."
        )
    # Only a configured queue has workers: a job on any other (an override, or a kind whose queue
    # this deployment's KOALA_QUEUES leaves out) would wait for ever.
    queue = targets.check_queue(spec.queue if spec.queue is not None else kind.queue)
    kind.check_input(spec.input)
    tenant = spec.input.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        # Budgets and pauses hold a job by this name (leases.Lease.tenant, the claim's input->>'tenant'):
        # anything else would be held by one and not the other.
        raise EnqueueError(
            f"input.tenant names the job's tenant for budgets and pauses: a string (or null), not {type(tenant).__name__}."
        )
    try:
        # allow_nan=False: NaN and Infinity are not JSON and jsonb refuses them. The input's size is
        # this text in UTF-8, as compact JSON without \u escapes (ensure_ascii would make a CJK
        # character 6 bytes instead of its 3, and a prompt of the length its kind advertises fail).
        encoded = json.dumps(spec.input, sort_keys=True, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        culprit = json_problem(spec.input, path="input") or exc
        raise EnqueueError(f"input for {kind.key} is not storable JSON: {culprit}.") from None
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate: not UTF-8, PostgreSQL cannot store it
        size = None
    # JSON writes NUL as \u0000, and a lone surrogate cannot be encoded: only then walk the input
    # to find the culprit.
    if size is None or "\\u0000" in encoded:
        unstorable = json_problem(spec.input, path="input")
        if unstorable or size is None:
            raise EnqueueError(f"input for {kind.key} cannot be stored: {unstorable or 'it is not valid UTF-8'}.")
    assert size is not None
    if size > kind.max_input_bytes:
        raise EnqueueError(
            f"input for {kind.key} is {size:,} bytes of JSON (UTF-8); the limit for {kind.key} is "
            f"{kind.max_input_bytes:,} bytes. Pass references (ids), not data."
        )
    key = spec.idempotency_key
    if key is not None and (not key.strip() or len(key) > _TEXT_LIMITS["idempotency_key"]):
        raise EnqueueError(f"idempotency_key must be 1-{_TEXT_LIMITS['idempotency_key']} characters.")
    for name, value in (("idempotency_key", key or ""), ("correlation_id", spec.correlation_id), ("created_by", created_by)):
        if len(value) > _TEXT_LIMITS[name]:
            raise EnqueueError(f"{name} is {len(value)} characters; the limit is {_TEXT_LIMITS[name]}.")
        if problem := text_problem(value):
            raise EnqueueError(f"{name} {problem}.")
    delay = spec.delay_seconds
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay) or delay > MAX_DELAY_SECONDS:
        raise EnqueueError(f"delay_seconds must be a finite number of seconds from 0 to {MAX_DELAY_SECONDS:.0f}.")
    if delay < 0:
        raise EnqueueError("delay_seconds cannot be negative.")
    if not -32768 <= spec.priority <= 32767:
        raise EnqueueError("priority must fit in a smallint (-32768..32767).")
    return kind, input_fingerprint(kind.name, kind.version, spec.input), encoded, queue


class _Row(NamedTuple):
    """One job's INSERT values, in sql.JOB_INSERT_COLUMNS order (the constant columns are in sql.JOB_ROW)."""

    kind: str
    version: int
    queue: str
    input: str  # JSON text
    input_fingerprint: str
    idempotency_key: str | None
    priority: int
    delivery: str
    scheduled_at: datetime
    deadline_at: datetime | None
    max_attempts: int
    timeout_seconds: float
    correlation_id: str
    trace_id: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    run_id: int | None
    step: str
    steps: str  # JSON text
    run_state: str  # JSON text
    operation_key_base: str


# The row names the insert's columns, in order: a field added to one and not the other fails at import.
assert sql.JOB_INSERT_COLUMNS.startswith(", ".join(_Row._fields) + ", ") and len(_Row._fields) == sql.JOB_ROW.count("%s")


def _lock_order(row: _Row) -> tuple[int, str, str]:
    # Key-less rows conflict with nothing; they go last, in the caller's order (sorted is stable).
    return (0, row.kind, row.idempotency_key) if row.idempotency_key is not None else (1, "", "")


def enqueue_many(*, specs: Sequence[JobSpec], created_by: str = "") -> list[EnqueueResult]:
    """Create jobs in one transaction and ring the doorbell after commit.

    A reused idempotency key returns the existing job when the input matches and
    raises EnqueueError (rolling back the whole batch) when it differs. Results are in
    the order of ``specs``.
    """
    if not specs:
        return []
    now = timezone.now()
    rows: list[_Row] = []
    seen_keys: dict[tuple[str, str], str] = {}
    for spec in specs:
        kind, fingerprint, encoded, queue = _validated(spec, created_by=created_by)
        if spec.idempotency_key is not None:
            previous = seen_keys.setdefault((kind.name, spec.idempotency_key), fingerprint)
            if previous != fingerprint:
                raise EnqueueError(f"idempotency key {spec.idempotency_key!r} appears twice in the batch with different input.")
        trace_id = spec.trace_id or secrets.token_hex(16)
        if spec.trace_id and any(row.trace_id == trace_id for row in rows):
            # The trace id maps the INSERT's RETURNING rows back to the specs (below).
            raise EnqueueError(f"trace_id {trace_id!r} appears twice in one batch; enqueue such jobs one at a time.")
        try:
            steps_json = json.dumps(dict(spec.steps), allow_nan=False, default=str)
            state_json = json.dumps(dict(spec.run_state), allow_nan=False, default=str)
        except (TypeError, ValueError) as exc:
            raise EnqueueError(f"a step's steps and run_state must be storable JSON: {exc}.") from None
        rows.append(
            _Row(
                kind=kind.name,
                version=kind.version,
                queue=queue,
                input=encoded,
                input_fingerprint=fingerprint,
                idempotency_key=spec.idempotency_key,
                priority=spec.priority,
                delivery=kind.delivery,
                scheduled_at=now + timedelta(seconds=spec.delay_seconds),
                deadline_at=now + timedelta(seconds=kind.deadline_seconds) if kind.deadline_seconds else None,
                max_attempts=kind.max_attempts,
                timeout_seconds=kind.timeout_seconds,
                correlation_id=spec.correlation_id or trace_id,
                trace_id=trace_id,
                created_by=created_by,
                created_at=now,
                updated_at=now,
                run_id=spec.run_id,
                step=spec.step,
                steps=steps_json,
                run_state=state_json,
                operation_key_base=spec.operation_key_base,
            )
        )

    # Deadlock freedom. Inserting a key that a concurrent, uncommitted batch has just inserted
    # waits for that batch's transaction (ON CONFLICT must know whether it commits). Two batches
    # that hold some of each other's keys, taken in different orders, would each wait for the
    # other: PostgreSQL aborts one with "deadlock detected" after deadlock_timeout. So every
    # batch inserts its keyed rows in one global order, (kind, key): a batch only ever waits for
    # one holding a smaller key, and no cycle can form. Results map back to the caller's order.
    order = sorted(range(len(rows)), key=lambda index: _lock_order(rows[index]))
    results: list[EnqueueResult | None] = [None] * len(rows)
    # One row, no audit record and no caller's transaction: the INSERT … ON CONFLICT is atomic
    # on its own, so autocommit saves the BEGIN/COMMIT round trips (on_commit then rings at once).
    lone_insert = len(rows) == 1 and not created_by and connection.get_autocommit()
    with nullcontext() if lone_insert else transaction.atomic(), connection.cursor() as cursor:
        for start in range(0, len(order), 500):
            chunk = order[start : start + 500]
            cursor.execute(sql.insert_jobs(len(chunk)), [value for index in chunk for value in rows[index]])
            # trace_id is fresh per row, so it maps RETURNING rows (which keep no order) back to specs.
            inserted = dict(cursor.fetchall())
            for index in chunk:
                row = rows[index]
                job_id = inserted.get(row.trace_id)
                if job_id is not None:
                    results[index] = EnqueueResult(job_id=job_id, created=True)
                    continue
                # Only a key conflict skips a row (and the conflicting row is committed, or ours:
                # ON CONFLICT waited for its transaction): compare inputs before handing it back.
                cursor.execute(sql.JOB_BY_KEY, [row.kind, row.idempotency_key])
                existing_id, existing_fingerprint = cursor.fetchone()
                if existing_fingerprint != row.input_fingerprint:
                    raise EnqueueError(
                        f"idempotency key {row.idempotency_key!r} was already used for a {row.kind} job (#{existing_id}) "
                        "with different input; nothing was enqueued."
                    )
                results[index] = EnqueueResult(job_id=existing_id, created=False)
        done = [result for result in results if result is not None]
        assert len(done) == len(rows)
        if created_by:
            record_audit(
                actor=created_by,
                action=AuditAction.ENQUEUE,
                target_type="job",
                # One job: its id. A batch: the first id (target_id is a short column); all ids in details.
                target_id=str(done[0].job_id),
                details={
                    "count": len(done),
                    "kinds": sorted({s.kind for s in specs}),
                    "job_ids": [r.job_id for r in done[:1000]],
                },
            )
        to_ring: dict[str, list[tuple[int, int]]] = {}
        for result, row in zip(done, rows, strict=True):
            if result.created and row.scheduled_at <= now:
                to_ring.setdefault(row.queue, []).append((result.job_id, row.version))
        # The doorbell must ring only for committed jobs, or a worker could look before the row exists.
        transaction.on_commit(lambda: [doorbell.ring(queue, jobs) for queue, jobs in to_ring.items()])
    return done


def enqueue(
    *,
    kind: str,
    input: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    version: int | None = None,
    queue: str | None = None,
    priority: int = 0,
    delay_seconds: float = 0.0,
    correlation_id: str = "",
    created_by: str = "",
) -> EnqueueResult:
    spec = JobSpec(
        kind=kind,
        input=input if input is not None else {},
        idempotency_key=idempotency_key,
        version=version,
        queue=queue,
        priority=priority,
        delay_seconds=delay_seconds,
        correlation_id=correlation_id,
    )
    return enqueue_many(specs=[spec], created_by=created_by)[0]


def _locked_job(job_id: int) -> Job:
    try:
        return Job.objects.select_for_update().get(pk=job_id)
    except Job.DoesNotExist:
        raise JobStateError(f"job {job_id} does not exist.") from None


def _finish_live_attempt(job: Job, outcome: str, message: str, *, requeued_by: str = "") -> None:
    Attempt.objects.filter(job=job, lease_token=job.lease_token, finished_at__isnull=True).update(
        outcome=outcome, finished_at=timezone.now(), error_message=message, requeued_by=requeued_by
    )


def cancel_job(*, job_id: int, actor: str, reason: str = "") -> Job:
    """Cancel a queued or running job. A running body learns at its next heartbeat
    (job_cancelled) and any report it makes afterwards is rejected."""
    reason = redact_text(reason)  # free text from a person: never store a pasted secret
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.is_terminal:
            raise JobStateError(f"job {job_id} is already {job.state}; terminal states never change.")
        previous = job.state
        if job.state == JobState.RUNNING:
            _finish_live_attempt(job, Outcome.CANCELLED, f"cancelled by {actor}")
        job.state = JobState.CANCELLED
        job.lease_holder = None
        job.lease_expires_at = None
        job.park_reason = None
        job.finished_at = timezone.now()
        job.error_message = reason[:500]
        job.save(
            update_fields=[
                "state",
                "lease_holder",
                "lease_expires_at",
                "park_reason",
                "finished_at",
                "error_message",
                "updated_at",
            ]
        )
        record_audit(
            actor=actor,
            action=AuditAction.CANCEL,
            target_type="job",
            target_id=job_id,
            details={"from": previous, "reason": reason[:200]},
        )
        outcome = Outcome.CANCELLED if previous == JobState.RUNNING else None
        transitions.reached([transitions.transition_of(job, outcome=outcome, cause="operator")])
        # Whatever the state: a job approved (so queued again) and cancelled before it ran
        # would otherwise keep an open approval. The job row is locked first, then what the
        # apps above hang on it (its reviews, withdrawn by the reviews app's callback): the
        # order every service that touches both keeps, so none can deadlock.
        hooks.run_on_cancel(job_id=job_id, actor=actor)
    return job


def fail_parked(*, job_id: int, reason: str, message: str, error_class: str, park_reason: str | None = None) -> bool:
    """End a parked job as failed (``reason``: a FailureReason), e.g. its review was rejected or expired.

    One conditional UPDATE decides: only a job still parked (for ``park_reason``, when given)
    changes; one that was requeued, unparked or cancelled meanwhile is left alone and the
    answer is False. Call inside the caller's transaction, after locking the job row first
    (the lock order job, then the caller's own rows), so its audit row commits with it.
    """
    parked = Job.objects.filter(pk=job_id, state=JobState.PARKED)
    if park_reason is not None:
        parked = parked.filter(park_reason=park_reason)
    failed = parked.update(
        state=JobState.FAILED,
        failure_reason=reason,
        park_reason=None,
        error_class=error_class,
        error_message=redact_text(message),
        finished_at=timezone.now(),
    )
    if failed:
        job = Job.objects.get(pk=job_id)
        transitions.reached([transitions.transition_of(job, outcome=None, cause="review")])
    return bool(failed)


def retry_job(*, job_id: int, actor: str) -> EnqueueResult:
    """Run a failed or cancelled job again, as a new job linked to the old one.

    Terminal states never revert, so the old record keeps its outcome. The new job carries the
    old one's operation keys (``operation_key_base``; its ``retry_of`` links them): each step
    finds the ledger row the old job left, so a step that happened is not sent again, one still
    open is reconciled first, and one that did not happen is re-sent under the same key, which
    the provider's idempotency also dedupes. A retry can therefore never double an effect.
    """
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state not in (JobState.FAILED, JobState.CANCELLED):
            raise JobStateError(f"job {job_id} is {job.state}; only failed or cancelled jobs can be retried.")
        kind = kinds.get(job.kind, job.version)
        if kind is None:
            raise JobStateError(f"job kind {job.kind}@{job.version} is not registered here; cannot retry it.")
        if kind.retry_instead:
            raise JobStateError(f"job {job_id} is an {job.kind} job and is not retried: {kind.retry_instead}.")
        try:
            result = enqueue(
                kind=job.kind,
                version=job.version,
                input=job.input,
                queue=job.queue,
                priority=job.priority,
                correlation_id=job.correlation_id,
            )
        except EnqueueError as exc:  # e.g. its queue is no longer configured: say so as the others do
            raise JobStateError(f"job {job_id} cannot be retried: {exc}") from None
        # The old job's key base, itself carried if it was a retry: a chain of retries shares one.
        base = operation_key_base(job_id=job.pk, idempotency_key=job.idempotency_key, carried=job.operation_key_base)
        # Same transaction as the insert: no worker can claim the new job before it has its keys.
        Job.objects.filter(pk=result.job_id).update(retry_of=job, operation_key_base=base)
        # Steps not done (open or failed) are the new job's to settle or send: move their rows so
        # a person sees them, and resolves them, on the job that waits for them. The old job is
        # terminal and locked above; its fenced writes (a cancelled body still running) fail.
        moved = Operation.objects.filter(job=job).exclude(state__in=DONE_OPERATION_STATES).update(job_id=result.job_id)
        record_audit(
            actor=actor,
            action=AuditAction.RETRY,
            target_type="job",
            target_id=job_id,
            details={"new_job": result.job_id, "operation_key_base": base, "operations_moved": moved},
        )
    return result


def unpark_jobs(*, job_ids: Sequence[int], reason: str) -> list[int]:
    """Queue again the jobs among ``job_ids`` still parked for ``reason``; ring after commit.

    One conditional UPDATE decides: a job unparked (or cancelled) meanwhile by someone else
    is not touched and not rung. Call inside the caller's transaction (its audit row).
    """
    if not job_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(sql.UNPARK_JOBS, [list(job_ids), reason])
        moved = cursor.fetchall()
    transitions.reached(transitions.transitions_of(moved, outcome=None, cause=_UNPARKED_BY.get(reason, "operator")))
    transitions.ring_after_commit(moved)
    return [row[0] for row in moved]


# Who unparks a job parked for each reason: the beat when its budget has room again, a reviewer's
# approval, a person who settled the operation that needed attention.
_UNPARKED_BY = {"budget": "budget", "waiting_review": "review", "needs_attention": "operator"}


def requeue_job(*, job_id: int, actor: str) -> Job:
    """Make a waiting or parked job due now, or take a running job away from its (stuck) holder.

    Taking a running job fences the holder: its next write is rejected as
    lease_superseded once the job is claimed again.
    """
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.is_terminal:
            raise JobStateError(f"job {job_id} is {job.state}; use retry for a finished job.")
        previous = job.state
        if job.state == JobState.RUNNING:
            # The fact, not only the message: the attempt's holder is fenced (lease_superseded).
            _finish_live_attempt(job, Outcome.INTERRUPTED, f"requeued by {actor}", requeued_by=actor)
            job.lease_holder = None
            job.lease_expires_at = None
            job.state = JobState.QUEUED
            if job.attempts >= job.max_attempts:
                job.max_attempts = job.attempts + 1  # an operator's requeue grants the attempt it asks for
        elif job.state == JobState.PARKED:
            # The operator takes responsibility: a review or budget park is re-checked when
            # the body reaches that point again, so requeueing cannot bypass the gate.
            job.state = JobState.QUEUED
            job.park_reason = None
            job.parked_on = {}
        job.scheduled_at = timezone.now()
        job.save()
        record_audit(actor=actor, action=AuditAction.REQUEUE, target_type="job", target_id=job_id, details={"from": previous})
        outcome = Outcome.INTERRUPTED if previous == JobState.RUNNING else None
        transitions.reached([transitions.transition_of(job, outcome=outcome, cause="operator")])
        queue, ring_job = job.queue, (job.pk, job.version)
        transaction.on_commit(lambda: doorbell.ring(queue, [ring_job]))
    return job
