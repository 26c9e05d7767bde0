"""Reading jobs for the console: the filtered list and grouped failures (one job's record is
``workers.selectors.jobs.job_for_person``; the actions on jobs are ``console.services``).

Reads of job and run data by a person are written to the audit log (R19; the worker's
machine loop never is). Everything shown passes through ``koala.redaction`` again at read
time, so the HTML never holds a value the redaction layer would mask, even for rows written
before a pattern was added.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils.functional import cached_property

from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from reviews.models import ReviewRequest
from workers import kinds
from workers.models import Attempt, FailureReason, Job, JobState, Outcome, ParkReason

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


def no_retry_kinds() -> dict[str, str]:
    """Kinds whose finished jobs are not retried, with what to do instead."""
    return {k.name: k.retry_instead for k in kinds.served() if k.retry_instead}


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
            actor=actor,
            action=AuditAction.READ,
            target_type="job_list",
            target_id="",
            details={**filters.as_details(), "page": page},
        )


# -- one job: what the console adds to the engine's view -----------------------------------------


def job_reviews(*, job_id: int) -> list[ReviewRequest]:
    """The job's review requests, oldest first (the job page links each to the review queue)."""
    return list(ReviewRequest.objects.filter(job_id=job_id).order_by("created_at"))


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
        record_audit(
            actor=actor, action=AuditAction.READ, target_type="failures", target_id="", details={"since": since.isoformat()}
        )
    return jobs, attempts
