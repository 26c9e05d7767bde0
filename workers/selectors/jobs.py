"""One job as a person sees it: the redacted, audited record behind every page and command
about a job (the console's job and review pages, the admin's job page, ``koala_job``).

Everything shown passes through the job's redaction context (``workers.kinds.job_redactor``)
again at read time, so a page never holds a value the redaction layer would mask, even in rows
written before a pattern was added. The read is written to the audit log here, and only here.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.db import models, transaction

from koala.audit import AuditAction, record_audit
from koala.redaction import Redactor
from workers import kinds
from workers.errors import EnqueueError, Rejection
from workers.models import Attempt, Job, Operation, Outcome

ERROR_CHARS = 2_000  # an error as a person reads it (stored ones are shorter; old rows may not be)
RETRIES_SHOWN = 20


def redacted_copy[Row: models.Model](obj: Row, redactor: Redactor) -> Row:
    """A copy of a row for a person to read, every text and JSON field passed through
    ``redactor`` (never saved: reads change nothing). Choice fields (states, reasons) are kept."""
    shown = copy.copy(obj)
    for f in obj._meta.concrete_fields:
        value = getattr(obj, f.attname)
        if isinstance(f, models.JSONField):
            setattr(shown, f.attname, redactor.data(value))
        elif isinstance(value, str) and not f.choices:
            setattr(shown, f.attname, redactor.text(value, limit=None))
    return shown


def retry_refusal(*, kind: str) -> str:
    """Why jobs of ``kind`` are not offered Retry ("" when they are): the kind's own advice."""
    try:
        return kinds.latest(kind).retry_instead
    except EnqueueError:
        return ""


def rejection(attempt: Attempt) -> Rejection | None:
    """The named rejection this attempt's holder got (or would get) for its outcome, from stored facts."""
    if attempt.outcome == Outcome.ORPHANED:
        return Rejection.LEASE_EXPIRED
    if attempt.outcome == Outcome.CANCELLED:
        return Rejection.JOB_CANCELLED
    if attempt.outcome == Outcome.INTERRUPTED and attempt.requeued_by:
        return Rejection.LEASE_SUPERSEDED
    return None


def time_split(attempt: Attempt, duration: float | None) -> list[tuple[str, float, float]]:
    """(part, seconds, percent): compute / db wait / storage wait, and the rest of the attempt's
    wall time as "other"."""
    parts = [
        ("compute", attempt.compute_seconds or 0.0),
        ("db wait", attempt.db_wait_seconds or 0.0),
        ("storage wait", attempt.storage_wait_seconds or 0.0),
    ]
    measured = sum(seconds for _, seconds in parts)
    total = max(duration or 0.0, measured)
    if total <= 0:
        return []
    parts.append(("other", max(total - measured, 0.0)))
    return [(name, seconds, round(100 * seconds / total, 1)) for name, seconds in parts]


def _error(redactor: Redactor, error_class: str, message: str) -> str:
    return redactor.text(f"{error_class}: {message}" if error_class else message, limit=ERROR_CHARS)


@dataclass(frozen=True)
class AttemptView:
    attempt: Attempt  # a redacted copy of the row
    error: str  # "ErrorClass: message", redacted
    duration: float | None  # seconds; None while it runs
    rejection: Rejection | None
    split: list[tuple[str, float, float]]  # time_split()


@dataclass(frozen=True)
class OperationView:
    operation: Operation  # a redacted copy of the row
    params: Any
    response: Any
    error: str


@dataclass(frozen=True)
class JobView:
    """A job as a person sees it. ``job`` is a redacted copy of the row (never saved); the other
    fields are the same values, ready to show."""

    job: Job
    redactor: Redactor  # the job's redaction context, for what a page masks itself (``redaction.extend``)
    input: Any
    run_state: Any
    result: Any
    progress: Any  # the last checkpoint
    usage: Any
    error: str  # "ErrorClass: message" (a cancelled job's reason has no class)
    park_detail: str
    attempts: list[AttemptView]
    operations: list[OperationView]
    cost_minor: int  # the sum of its operations' costs
    retries: list[int]  # the jobs that retried it (the first RETRIES_SHOWN)
    retry_refusal: str  # why Retry is not offered for its kind ("" when it is)


def job_for_person(*, job_id: int, actor: str, audit: bool = True) -> JobView:
    """Job ``job_id`` as ``actor`` may see it, redacted with the job's context; the read is
    audited (``audit=False`` only for a caller that audits the same read itself). Raises
    Job.DoesNotExist, before anything is audited, when there is no such job."""
    job = Job.objects.get(pk=job_id)
    redactor = kinds.job_redactor(job)
    shown = redacted_copy(job, redactor)
    attempts = []
    for attempt in job.attempt_set.order_by("number"):
        duration = (attempt.finished_at - attempt.started_at).total_seconds() if attempt.finished_at else None
        attempts.append(
            AttemptView(
                attempt=redacted_copy(attempt, redactor),
                error=_error(redactor, attempt.error_class, attempt.error_message),
                duration=duration,
                rejection=rejection(attempt),
                split=time_split(attempt, duration),
            )
        )
    operations = []
    for op in job.operations.order_by("id"):
        row = redacted_copy(op, redactor)
        operations.append(
            OperationView(
                operation=row,
                params=row.params,
                response=row.response,
                error=redactor.text(op.error_message, limit=ERROR_CHARS),
            )
        )
    if audit:
        with transaction.atomic():
            record_audit(actor=actor, action=AuditAction.READ, target_type="job", target_id=job.pk)
    return JobView(
        job=shown,
        redactor=redactor,
        input=shown.input,
        run_state=shown.run_state,
        result=shown.result,
        progress=shown.progress,
        usage=shown.usage,
        error=_error(redactor, job.error_class, job.error_message),
        park_detail=redactor.text(job.park_detail, limit=ERROR_CHARS),
        attempts=attempts,
        operations=operations,
        cost_minor=sum(op.operation.cost_minor or 0 for op in operations),
        retries=list(Job.objects.filter(retry_of=job).order_by("id").values_list("id", flat=True)[:RETRIES_SHOWN]),
        retry_refusal=retry_refusal(kind=job.kind),
    )
