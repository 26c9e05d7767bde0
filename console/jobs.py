"""Reading jobs for people: the filtered list, one job's full record, grouped failures, and
bulk actions on a selection.

Reads of job and run data by a person are written to the audit log (R19; the worker's
machine loop never is). Everything shown passes through ``koala.redaction`` again at read
time, with the kind's declared sensitive fields, so the HTML never holds a value the
redaction layer would mask, even for rows written before a pattern was added.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils.functional import cached_property

from koala.audit import record_audit
from koala.redaction import Redactor, redact_text
from workers import kinds
from workers.errors import EnqueueError, JobStateError
from workers.models import Attempt, FailureReason, Job, JobState, Operation, Outcome, ParkReason
from workers.services.jobs import cancel_job, requeue_job, retry_job

LIST_FIELDS = (
    "id",
    "kind",
    "version",
    "queue",
    "state",
    "park_reason",
    "failure_reason",
    "attempts",
    "max_attempts",
    "priority",
    "scheduled_at",
    "created_at",
    "finished_at",
    "error_class",
)

BULK_LIMIT = 500  # one request changes at most this many jobs; a bigger selection must be narrowed


def no_retry_kinds() -> dict[str, str]:
    """Kinds whose finished jobs are not retried, with what to do instead."""
    return {k.name: k.retry_instead for k in kinds.served() if k.retry_instead}


def retry_refusal(*, kind: str) -> str:
    """Why jobs of ``kind`` are not offered Retry ("" when they are): the kind's own advice."""
    try:
        return kinds.latest(kind).retry_instead
    except EnqueueError:
        return ""


@dataclass(frozen=True)
class JobFilter:
    state: str = ""
    kind: str = ""
    queue: str = ""
    reason: str = ""  # a failure or park reason
    created_after: dt.datetime | None = None
    created_before: dt.datetime | None = None
    search: str = ""  # a job id, idempotency key, trace or correlation id

    def as_details(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.__dict__.items() if v not in ("", None)}


# Newest first, ties broken by id: exactly the order the list indexes end in (job_list_idx,
# job_state_list_idx, job_kind_state_list_idx, job_queue_state_list_idx, job_failed_list_idx;
# migration 0009), so a page under any of their filters reads 50 index entries, not the table.
LIST_ORDER = ("-created_at", "-id")

# The list counts its matches up to this many and says "more than" beyond: an exact count(*)
# is O(matching rows) (120 ms for the 700k succeeded jobs of a 1M-job table), the only
# per-page cost that would grow with the table. 200 pages of 50; narrow the filter for more.
COUNT_CAP = 10_000


class ListPaginator(Paginator):
    """A Paginator whose count stops at COUNT_CAP (``capped`` says there are more)."""

    capped = False

    @cached_property
    def count(self) -> int:
        # COUNT(*) over a LIMIT subquery without the ORDER BY (any COUNT_CAP + 1 matches tell
        # "more than"), so an index-only scan of the filter's index can answer it.
        jobs = self.object_list
        assert isinstance(jobs, QuerySet)  # built from filtered_jobs()
        found = jobs.order_by()[: COUNT_CAP + 1].count()
        self.capped = found > COUNT_CAP
        return min(found, COUNT_CAP)


def filtered_jobs(filters: JobFilter) -> QuerySet[Job]:
    """The list's query: newest first, only the listed columns, no joins (so no N+1)."""
    jobs = Job.objects.only(*LIST_FIELDS).order_by(*LIST_ORDER)
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.kind:
        jobs = jobs.filter(kind=filters.kind)
    if filters.queue:
        jobs = jobs.filter(queue=filters.queue)
    if filters.reason:
        # A failure reason implies state 'failed' and a park reason state 'parked' (the
        # job_failed_has_reason / job_parked_has_reason constraints), so naming the state
        # selects the same rows and lets the state's index serve them instead of an OR.
        if filters.reason in FailureReason.values:
            jobs = jobs.filter(state=JobState.FAILED, failure_reason=filters.reason)
        elif filters.reason in ParkReason.values:
            jobs = jobs.filter(state=JobState.PARKED, park_reason=filters.reason)
        else:
            jobs = jobs.filter(Q(failure_reason=filters.reason) | Q(park_reason=filters.reason))
    if filters.created_after:
        jobs = jobs.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        jobs = jobs.filter(created_at__lt=filters.created_before)
    if filters.search:
        # Exact matches only (the page offers no prefix search): each arm is one btree look-up
        # (job_idempotency_key_idx, job_trace_idx, job_correlation_idx, the primary key),
        # combined by a BitmapOr.
        term = filters.search.strip()
        match = Q(idempotency_key=term) | Q(trace_id=term) | Q(correlation_id=term)
        if term.isascii() and term.isdigit():  # str.isdigit() alone accepts "²", which int() refuses
            match |= Q(pk=int(term))
        jobs = jobs.filter(match)
    return jobs


def record_list_read(*, actor: str, filters: JobFilter, page: int) -> None:
    with transaction.atomic():
        record_audit(
            actor=actor, action="read", target_type="job_list", target_id="", details={**filters.as_details(), "page": page}
        )


# -- one job ------------------------------------------------------------------------------------


@dataclass
class AttemptRow:
    attempt: Attempt
    error: str
    duration: float | None
    rejection: str  # the named rejection its holder got (or would get) for this outcome
    split: list[tuple[str, float, float]]  # (part, seconds, percent of the attempt)


@dataclass
class OperationRow:
    operation: Operation
    params: Any
    response: Any
    error: str


@dataclass
class JobRecord:
    job: Job
    redactor: Redactor  # the job's redaction context (workers.kinds.job_redactor)
    input: Any
    run_state: Any
    result: Any
    progress: Any
    usage: Any
    error: str
    park_detail: str
    attempts: list[AttemptRow]
    operations: list[OperationRow]
    cost_minor: int
    retry_refusal: str = ""  # why Retry is not offered for this kind ("" when it is)
    retries: list[int] = field(default_factory=list)
    reviews: list[Any] = field(default_factory=list)


def _rejection(attempt: Attempt) -> str:
    if attempt.outcome == Outcome.ORPHANED:
        return "lease_expired"
    if attempt.outcome == Outcome.CANCELLED:
        return "job_cancelled"
    if attempt.outcome == Outcome.INTERRUPTED and attempt.error_message.startswith("requeued by"):
        return "lease_superseded"
    return ""


def _split(attempt: Attempt, duration: float | None) -> list[tuple[str, float, float]]:
    """Compute / db wait / storage wait, and the rest of the attempt's wall time as "other"."""
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


def read_job(*, job_id: int, actor: str) -> JobRecord:
    """One job as a person sees it, redacted with the job's redaction context (the record
    carries it: the page joins it to the request's, for what its template shows), with the read
    written to the audit log."""
    job = Job.objects.get(pk=job_id)
    redactor = kinds.job_redactor(job)

    def text(value: str) -> str:
        return redactor.text(value, limit=2_000)

    def data(value: Any) -> Any:
        return redactor.data(value)

    attempts = []
    for attempt in job.attempt_set.order_by("number"):
        duration = (attempt.finished_at - attempt.started_at).total_seconds() if attempt.finished_at else None
        error = f"{attempt.error_class}: {attempt.error_message}" if attempt.error_class else attempt.error_message
        attempts.append(
            AttemptRow(
                attempt=attempt,
                error=text(error),
                duration=duration,
                rejection=_rejection(attempt),
                split=_split(attempt, duration),
            )
        )
    operations = [
        OperationRow(operation=op, params=data(op.params), response=data(op.response), error=text(op.error_message))
        for op in job.operations.order_by("id")
    ]
    with transaction.atomic():
        record_audit(actor=actor, action="read", target_type="job", target_id=job.pk)
    return JobRecord(
        job=job,
        redactor=redactor,
        input=data(job.input),
        run_state=data(job.run_state),
        result=data(job.result),
        progress=data(job.progress),
        usage=data(job.usage),
        error=text(f"{job.error_class}: {job.error_message}" if job.error_class else job.error_message),
        park_detail=text(job.park_detail),
        attempts=attempts,
        operations=operations,
        cost_minor=sum(row.operation.cost_minor or 0 for row in operations),
        retry_refusal=retry_refusal(kind=job.kind),
        retries=list(Job.objects.filter(retry_of=job).values_list("id", flat=True)[:20]),
        reviews=list(job.reviews.order_by("created_at")),
    )


# -- failures -----------------------------------------------------------------------------------


@dataclass
class FailureGroup:
    kind: str
    error_class: str
    reason: str
    count: int
    last_at: dt.datetime
    latest_id: int  # the newest failed job (or attempt's job) of the group
    sample: str  # that row's message, redacted again


def failure_groups(*, since: dt.datetime, actor: str) -> tuple[list[FailureGroup], list[FailureGroup]]:
    """Failed jobs and failed/retried attempts since ``since``, grouped by kind and error class.

    Four queries whatever the number of failures: two aggregates and two sample look-ups.
    """
    job_rows = list(
        Job.objects.filter(state=JobState.FAILED, finished_at__gte=since)
        .values("kind", "error_class", "failure_reason")
        .annotate(count=Count("id"), last_at=Max("finished_at"), latest_id=Max("id"))
        .order_by("-count", "kind")[:100]
    )
    job_samples = dict(Job.objects.filter(pk__in=[r["latest_id"] for r in job_rows]).values_list("pk", "error_message"))
    jobs = [
        FailureGroup(
            kind=r["kind"],
            error_class=r["error_class"] or "(none)",
            reason=r["failure_reason"] or "",
            count=r["count"],
            last_at=r["last_at"],
            latest_id=r["latest_id"],
            sample=redact_text(job_samples.get(r["latest_id"], "")),
        )
        for r in job_rows
    ]
    attempt_rows = list(
        Attempt.objects.filter(outcome__in=[Outcome.RETRY, Outcome.FAILED, Outcome.ORPHANED], finished_at__gte=since)
        .values("job__kind", "error_class", "outcome")
        .annotate(count=Count("id"), last_at=Max("finished_at"), latest_id=Max("id"))
        .order_by("-count", "job__kind")[:100]
    )
    attempt_samples = {
        pk: (message, job_id)
        for pk, message, job_id in Attempt.objects.filter(pk__in=[r["latest_id"] for r in attempt_rows]).values_list(
            "pk", "error_message", "job_id"
        )
    }
    attempts = [
        FailureGroup(
            kind=r["job__kind"],
            error_class=r["error_class"] or "(none)",
            reason=r["outcome"] or "",
            count=r["count"],
            last_at=r["last_at"],
            latest_id=attempt_samples.get(r["latest_id"], ("", 0))[1],
            sample=redact_text(attempt_samples.get(r["latest_id"], ("", 0))[0]),
        )
        for r in attempt_rows
    ]
    with transaction.atomic():
        record_audit(actor=actor, action="read", target_type="failures", target_id="", details={"since": since.isoformat()})
    return jobs, attempts


# -- actions ------------------------------------------------------------------------------------

ACTIONS = {"cancel": "Cancelled", "retry": "Retried", "requeue": "Requeued"}


@dataclass
class ActionResult:
    verb: str
    done: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def job_action(*, action: str, job_id: int, actor: str, reason: str = "") -> str:
    """Run one operator action through the engine's service; returns a message for the person."""
    if action == "cancel":
        cancel_job(job_id=job_id, actor=actor, reason=reason or f"cancelled by {actor} in the console")
        return f"Job {job_id} cancelled."
    if action == "retry":
        # retry_job refuses kinds that say how to try again instead (an export is requested anew).
        new = retry_job(job_id=job_id, actor=actor)
        return f"Job {job_id} retried as job {new.job_id}."
    if action == "requeue":
        requeue_job(job_id=job_id, actor=actor)
        return f"Job {job_id} requeued."
    raise JobStateError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}.")


def bulk_job_action(*, action: str, job_ids: list[int], actor: str, reason: str = "", selection: dict[str, str]) -> ActionResult:
    """The same action on many jobs, each through its own audited service call.

    One job's wrong state does not stop the others; the person sees which ones failed and why.
    A summary row records what was selected (ids or filter) and by whom.
    """
    if action not in ACTIONS:
        raise JobStateError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}.")
    if len(job_ids) > BULK_LIMIT:
        raise JobStateError(f"{len(job_ids)} jobs selected; at most {BULK_LIMIT} per request. Narrow the filter.")
    result = ActionResult(verb=ACTIONS[action])
    for job_id in job_ids:
        try:
            job_action(action=action, job_id=job_id, actor=actor, reason=reason)
            result.done.append(job_id)
        except (JobStateError, Job.DoesNotExist) as exc:
            result.errors.append(str(exc))
    with transaction.atomic():
        record_audit(
            actor=actor,
            action=f"bulk_{action}",
            target_type="job",
            target_id=f"{len(result.done)} jobs",
            details={"selection": selection, "done": result.done[:100], "errors": len(result.errors)},
        )
    return result
