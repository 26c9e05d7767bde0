"""Reading workflow runs for people: the runs list and one run's journal, redacted, the read audited.

The journal is ``flows.selectors.run_view`` (steps, attempts, waits and signals, the state after
each step, operations, usage and cost) with every value passed through the run's redaction
context (``flows.selectors.run_redactor``), the named rejection of each attempt, and the spans
each attempt's body recorded (``traces.selectors.spans_of_job``) nested under the attempt's span.
When no span was stored (traces came later, or the rows were pruned) the steps stand alone.

A person's read is written to the audit log in the same transaction as the read
(``flows.services.read_run``); the list's read is one row per page, like the job list.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from flows import services as flow_services
from flows.models import Run
from flows.selectors import AttemptView, OperationView, RunView, SignalView, StepView, list_runs, run_redactor
from koala.audit import AuditAction, record_audit
from koala.redaction import Redactor
from traces.selectors import spans_of_job
from workers.models import Attempt
from workers.selectors.jobs import rejection

PAGE_SIZE = 50
ERROR_CHARS = 2_000


@dataclass(frozen=True)
class RunsPage:
    runs: list[Run]
    older_than: int | None  # the ``before`` of the next (older) page; None on the last page


def runs_page(*, actor: str, state: str = "", definition: str = "", before: int | None = None) -> RunsPage:
    """One page of runs, newest first (keyset paging: ``before`` is the id the last page ended
    at). The person's read is audited, filter and page included."""
    found = list_runs(state=state or None, definition=definition or None, limit=PAGE_SIZE + 1, before_id=before)
    more = len(found) > PAGE_SIZE
    runs = found[:PAGE_SIZE]
    with transaction.atomic():
        record_audit(
            actor=actor,
            action=AuditAction.READ,
            target_type="run_list",
            target_id="",
            details={"state": state, "definition": definition, "before": before or "", "shown": len(runs)},
        )
    return RunsPage(runs=runs, older_than=runs[-1].pk if more and runs else None)


@dataclass(frozen=True)
class SpanLine:
    depth: int  # 0: the attempt's own span; 1: a span its body recorded; 2: one inside that …
    name: str
    kind: str
    started_at: datetime | None
    duration_seconds: float | None
    attributes: dict[str, Any]
    usage: dict[str, Any]
    error: str


@dataclass(frozen=True)
class AttemptLine:
    attempt: AttemptView  # redacted
    rejection: str  # the named rejection its holder got (lease_expired, job_cancelled …), or ""
    duration_seconds: float | None
    spans: list[SpanLine] = field(default_factory=list)  # the attempt's span first, its body's under it


@dataclass(frozen=True)
class StepLine:
    step: StepView  # redacted
    attempts: list[AttemptLine]
    signal: SignalView | None  # for a wait: the signal it consumed
    duration_seconds: float | None  # due to finished


@dataclass(frozen=True)
class Journal:
    run: RunView  # redacted
    steps: list[StepLine]
    signals: list[SignalView]  # redacted, oldest first
    traced: bool  # some step has stored spans
    redactor: Redactor


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start is not None and end is not None else None


def journal_for_person(*, run_id: int, actor: str) -> Journal:
    """Run ``run_id``'s journal as a person reads it. The audit row and the read are one
    transaction (``flows.services.read_run``). UnknownRun, with nothing audited, for no such run."""
    with transaction.atomic():
        view = flow_services.read_run(run_id=run_id, actor=actor)
        run = Run.objects.get(pk=view.id)
        redactor = run_redactor(run)
        job_ids = [s.job_id for s in view.steps if s.job_id is not None]
        stored = {(a.job_id, a.number): a for a in Attempt.objects.filter(job_id__in=job_ids)}
        spans = {job_id: spans_of_job(job_id=job_id) for job_id in job_ids}
    signals = [_signal(redactor, s) for s in view.signals]
    consumed = {s.consumed_by: s for s in signals if s.consumed_by}
    steps: list[StepLine] = []
    for step in view.steps:
        trees = spans.get(step.job_id or 0, [])
        attempts = []
        for attempt in step.attempts:
            row = stored.get((step.job_id or 0, attempt.number))
            found = rejection(row) if row is not None else None
            lines = [
                _span(redactor, depth, node)
                for tree in trees
                if row is not None and tree.attempt_id == row.pk
                for depth, node in tree.walk()
            ]
            attempts.append(
                AttemptLine(
                    attempt=dataclasses.replace(
                        attempt,
                        worker_id=redactor.text(attempt.worker_id, limit=None),
                        error_message=redactor.text(attempt.error_message, limit=ERROR_CHARS),
                        usage=redactor.data(attempt.usage),
                    ),
                    rejection=str(found.value) if found is not None else "",
                    duration_seconds=_seconds(attempt.started_at, attempt.finished_at),
                    spans=lines,
                )
            )
        steps.append(
            StepLine(
                step=dataclasses.replace(
                    step,
                    output=redactor.data(step.output),
                    state_after=redactor.data(step.state_after),
                    error=redactor.text(step.error, limit=ERROR_CHARS),
                    usage=redactor.data(step.usage),
                    operations=[_operation(redactor, op) for op in step.operations],
                    attempts=[],
                ),
                attempts=attempts,
                signal=consumed.get(step.name) if step.wait_event else None,
                duration_seconds=_seconds(step.due_at, step.finished_at),
            )
        )
    shown = dataclasses.replace(
        view,
        input=redactor.data(view.input),
        run_state=redactor.data(view.run_state),
        idempotency_key=redactor.text(view.idempotency_key, limit=None) if view.idempotency_key else view.idempotency_key,
        error=redactor.text(view.error, limit=ERROR_CHARS),
        created_by=redactor.text(view.created_by, limit=None),
        steps=[],
        signals=[],
    )
    return Journal(
        run=shown,
        steps=steps,
        signals=signals,
        traced=any(line.spans for s in steps for line in s.attempts),
        redactor=redactor,
    )


def _signal(redactor: Redactor, signal: SignalView) -> SignalView:
    return dataclasses.replace(
        signal,
        key=redactor.text(signal.key, limit=None),
        payload=redactor.data(signal.payload),
        sent_by=redactor.text(signal.sent_by, limit=None),
    )


def _operation(redactor: Redactor, op: OperationView) -> OperationView:
    return dataclasses.replace(op, key=redactor.text(op.key, limit=None), external_id=redactor.text(op.external_id, limit=None))


def _span(redactor: Redactor, depth: int, node: Any) -> SpanLine:
    return SpanLine(
        depth=depth,
        name=redactor.text(node.name, limit=None),
        kind=node.kind,
        started_at=node.started_at,
        duration_seconds=node.duration_seconds,
        attributes=redactor.data(node.attributes),
        usage=redactor.data(node.usage),
        error=redactor.text(node.error, limit=None),
    )
