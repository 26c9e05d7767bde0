"""Workflow runs' reads: one run's journal (``run_view``), lists, and the runs no worker can serve.

Reads change nothing: auditing a person's read is the caller's (the API and the console write a
READ row for a person; the machine loop reads nothing here). Every value shown passes the
redaction layer the engine's records already did (job inputs, errors, operations' params).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from flows.models import LIVE_RUN_STATES, Run, RunStep, Signal, StepState
from koala.redaction import Redactor
from workers import definitions
from workers import kinds as job_kinds
from workers.models import Attempt, Job, JobState, Operation, WorkerProcess
from workers.spans import attempt_span_id


@dataclass(frozen=True)
class AttemptView:
    number: int
    worker_id: str
    outcome: str | None
    error_class: str
    error_message: str
    started_at: datetime
    finished_at: datetime | None
    usage: dict[str, Any]
    span_id: str  # the attempt's span (workers.spans.attempt_span_id): a retry or a reclaim is a new one


@dataclass(frozen=True)
class OperationView:
    name: str
    kind: str
    state: str
    key: str
    amount_minor: int | None
    currency: str
    cost_minor: int | None
    external_id: str


@dataclass(frozen=True)
class StepView:
    name: str
    kind: str  # "" for a wait
    state: str
    version: int | None
    job_id: int | None
    job_state: str | None
    wait_event: str
    wait_deadline: datetime | None
    output: Any
    state_after: Any
    error_code: str
    error: str
    due_at: datetime | None
    finished_at: datetime | None
    span_id: str
    attempts: list[AttemptView] = field(default_factory=list)
    operations: list[OperationView] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    cost_minor: int = 0


@dataclass(frozen=True)
class SignalView:
    id: int
    name: str
    key: str
    payload: Any
    status: str
    consumed_by: str
    sent_by: str
    created_at: datetime
    consumed_at: datetime | None


@dataclass(frozen=True)
class RunView:
    id: int
    definition: str
    version: int
    state: str
    input: Any
    run_state: Any
    idempotency_key: str | None
    trace_id: str
    correlation_id: str
    created_by: str
    error_code: str
    error: str
    created_at: datetime
    finished_at: datetime | None
    steps: list[StepView]
    signals: list[SignalView]
    usage: dict[str, float]
    cost_minor: int


def run_view(run_id: int) -> RunView | None:
    """One run's journal: its steps in definition order, each with its attempts (worker ids,
    outcomes, named errors, timings), the state after it, the operations it sent and its usage
    and cost; the signals it received; the run's totals. None for no such run."""
    run = Run.objects.filter(pk=run_id).first() if isinstance(run_id, int) else None
    if run is None:
        return None
    definition = definitions.get(run.definition, run.version)
    rows = list(RunStep.objects.filter(run=run).order_by("id"))
    job_ids = [row.job_id for row in rows if row.job_id is not None]
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids)}
    attempts: dict[int, list[AttemptView]] = {}
    for a in Attempt.objects.filter(job_id__in=job_ids).order_by("job_id", "number"):
        attempts.setdefault(a.job_id, []).append(
            AttemptView(
                number=a.number,
                worker_id=a.worker_id,
                outcome=a.outcome,
                error_class=a.error_class,
                error_message=a.error_message,
                started_at=a.started_at,
                finished_at=a.finished_at,
                usage=a.usage,
                span_id=attempt_span_id(trace_id=jobs[a.job_id].trace_id, job_id=a.job_id, lease_token=a.lease_token),
            )
        )
    operations: dict[int, list[OperationView]] = {}
    for op in Operation.objects.filter(job_id__in=job_ids).order_by("id"):
        operations.setdefault(op.job_id, []).append(
            OperationView(
                name=op.name,
                kind=op.kind,
                state=op.state,
                key=op.key,
                amount_minor=op.amount_minor,
                currency=op.currency,
                cost_minor=op.cost_minor,
                external_id=op.external_id,
            )
        )
    order = list(definition.steps) if definition else []
    rows.sort(key=lambda r: order.index(r.name) if r.name in order else len(order))
    steps: list[StepView] = []
    total_usage: dict[str, float] = {}
    total_cost = 0
    for row in rows:
        spec = definition.steps.get(row.name) if definition else None
        job = jobs.get(row.job_id) if row.job_id is not None else None
        usage = dict(job.usage) if job else {}
        cost = sum(op.cost_minor or 0 for op in operations.get(row.job_id or 0, []))
        for k, v in usage.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                total_usage[k] = total_usage.get(k, 0) + v
        total_cost += cost
        steps.append(
            StepView(
                name=row.name,
                kind=spec.kind if spec else (job.kind if job else ""),
                state=row.state,
                version=row.version,
                job_id=row.job_id,
                job_state=job.state if job else None,
                wait_event=spec.wait.event if spec and spec.wait else "",
                wait_deadline=row.wait_deadline,
                output=row.output,
                state_after=row.state_after,
                error_code=row.error_code,
                error=row.error,
                due_at=row.due_at,
                finished_at=row.finished_at,
                # The step's span is its latest attempt's (the one the journal's spans hang under last).
                span_id=attempts[row.job_id][-1].span_id if row.job_id in attempts else "",
                attempts=attempts.get(row.job_id or 0, []),
                operations=operations.get(row.job_id or 0, []),
                usage=usage,
                cost_minor=cost,
            )
        )
    signals = [
        SignalView(
            id=s.pk,
            name=s.name,
            key=s.key,
            payload=s.payload,
            status=s.status,
            consumed_by=s.consumed_by,
            sent_by=s.sent_by,
            created_at=s.created_at,
            consumed_at=s.consumed_at,
        )
        for s in Signal.objects.filter(run=run).order_by("id")
    ]
    return RunView(
        id=run.pk,
        definition=run.definition,
        version=run.version,
        state=run.state,
        input=run.input,
        run_state=run.run_state,
        idempotency_key=run.idempotency_key,
        trace_id=run.trace_id,
        correlation_id=run.correlation_id,
        created_by=run.created_by,
        error_code=run.error_code,
        error=run.error,
        created_at=run.created_at,
        finished_at=run.finished_at,
        steps=steps,
        signals=signals,
        usage=total_usage,
        cost_minor=total_cost,
    )


def run_redactor(run: Run) -> Redactor:
    """The redaction context of a stored run: what every page and command about it masks.

    The sensitive fields its steps' kinds declare (at the run's version; a step's kind not served
    here borrows every served version's declarations, as ``kinds.job_redactor`` does), the values
    under them and under the always-sensitive keys in the run's input, its state and its signals'
    payloads (a secret a step put in the state, or a signal carried, is masked wherever it repeats)."""
    definition = definitions.get(run.definition, run.version)
    step_kinds = {step.kind for step in definition.steps.values() if step.kind} if definition else set()
    declared: set[str] = set()
    for kind in job_kinds.served():
        if kind.name in step_kinds:
            declared.update(kind.sensitive_fields)
    redactor = Redactor.of(run.input, sensitive=declared).learn(run.run_state)
    for payload in Signal.objects.filter(run=run).values_list("payload", flat=True):
        redactor = redactor.learn(payload)
    for state_after in RunStep.objects.filter(run=run, state_after__isnull=False).values_list("state_after", flat=True):
        redactor = redactor.learn(state_after)
    return redactor


def list_runs(
    *, state: str | None = None, definition: str | None = None, limit: int = 50, before_id: int | None = None
) -> list[Run]:
    """Runs newest first (``before_id``: the page after the one that ended at that id)."""
    runs = Run.objects.all()
    if state:
        runs = runs.filter(state=state)
    if definition:
        runs = runs.filter(definition=definition)
    if before_id is not None:
        runs = runs.filter(pk__lt=before_id)
    return list(runs.order_by("-created_at", "-id")[: max(1, min(limit, 500))])


@dataclass(frozen=True)
class StrandedRun:
    run_id: int
    definition: str
    version: int
    missing: list[str]  # the "kind@version" pairs its due steps need and no live worker serves
    served_versions: list[int]  # versions of the definition some live worker serves completely


def served_pairs(*, live_seconds: float | None = None) -> set[str]:
    """The "kind@version" pairs live workers serve: RQ workers and HTTP workers alike record
    them in their worker-process rows (not stopped, seen within ``live_seconds``)."""
    seconds = WorkerProcess.silent_after_seconds() if live_seconds is None else live_seconds
    since = timezone.now() - timedelta(seconds=seconds)
    pairs: set[str] = set()
    for kinds in WorkerProcess.objects.filter(stopped_at__isnull=True, last_seen_at__gte=since).values_list("kinds", flat=True):
        pairs.update(k for k in kinds or [] if isinstance(k, str))
    return pairs


def stranded_runs(*, live_seconds: float | None = None, definitions_: Sequence[str] | None = None) -> list[StrandedRun]:
    """Live runs with a step due (its job queued) at a version no live worker serves: nothing
    would ever run it. The console lists them (and the metrics count them); ``move_to_version``
    is the way out."""
    served = served_pairs(live_seconds=live_seconds)
    due = RunStep.objects.filter(
        run__state__in=LIVE_RUN_STATES, state=StepState.QUEUED, job__state=JobState.QUEUED
    ).select_related("job", "run")
    if definitions_:
        due = due.filter(run__definition__in=list(definitions_))
    missing: dict[int, tuple[Run, set[str]]] = {}
    for row in due:
        assert row.job is not None
        pair = f"{row.job.kind}@{row.job.version}"
        if pair not in served:
            missing.setdefault(row.run_id, (row.run, set()))[1].add(pair)
    answer = []
    for run_id, (run, pairs) in sorted(missing.items()):
        versions = [d.version for d in definitions.definitions() if d.name == run.definition and set(d.kind_keys()) <= served]
        answer.append(
            StrandedRun(
                run_id=run_id, definition=run.definition, version=run.version, missing=sorted(pairs), served_versions=versions
            )
        )
    return answer
