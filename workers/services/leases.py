"""Lease services: claim, heartbeat, complete, fail, release. The machine loop.

Every write after the claim names the attempt's fencing token: ``UPDATE … WHERE id = … AND
lease_token = <mine> AND state = 'running' AND lease_expires_at > now()`` (``sql.LIVE_LEASE``).
Zero rows means the attempt is stale; ``rejection_for`` then names why, from the
closed set in ``workers.errors.Rejection``. Never check-then-write: the row count
of the conditional write is the decision.

These run once or twice per job, so they are hand-written SQL (one statement, one
commit each) rather than ORM sequences: the engine's whole overhead per job is
enqueue + claim + complete = three commits. The statements are in workers.sql; the fence
predicate they share is ``sql.LIVE_LEASE``, and ``hold_lease`` is the one strict fence for
writes to other tables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from koala.redaction import redact_text
from workers import kinds, sql
from workers.errors import Rejection
from workers.models import FailureReason, JobState, Outcome, ParkReason
from workers.services import budgets
from workers.services.budgets import BudgetExhausted, ClaimBlocked


@dataclass(frozen=True)
class Lease:
    job_id: int
    attempt_id: int
    kind: str
    version: int
    queue: str
    input: dict[str, Any]
    run_state: dict[str, Any]
    progress: dict[str, Any]
    lease_token: int
    attempts: int
    max_attempts: int
    delivery: str
    timeout_seconds: float
    deadline_at: datetime | None
    correlation_id: str
    trace_id: str
    idempotency_key: str | None
    created_by: str
    operation_key_base: str  # an operator retry's carried key base ('' for the job's own)
    budget_usage_ids: tuple[int, ...] = ()  # usage rows whose run time this attempt adds when it ends

    @property
    def tenant(self) -> str:
        value = self.input.get("tenant")
        return value if isinstance(value, str) else ""


def _json(value: Any) -> Any:
    # Django registers a jsonb loader that returns text (it decodes in from_db_value).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _lease(row: Sequence[Any]) -> Lease:
    values = list(row)
    for index in (5, 6, 7):  # input, run_state, progress
        values[index] = _json(values[index])
    return Lease(*values)


@dataclass(frozen=True)
class HeldLease:
    """Attempt ``lease.attempt_id`` as the HTTP protocol finds it: its lease, who holds it, and
    the outcome already recorded for it (None while it runs)."""

    lease: Lease
    worker_id: str
    outcome: str | None
    started_at: datetime


def lease_of(*, attempt_id: int) -> HeldLease | None:
    """The lease attempt ``attempt_id`` holds or held (a read; the fence is each write's)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.LEASE_OF_ATTEMPT, [attempt_id])
        row = cursor.fetchone()
    if row is None:
        return None
    return HeldLease(lease=_lease(row[:-3]), worker_id=row[-3], outcome=row[-2], started_at=row[-1])


def _claim(statement: str, params: dict[str, Any], *, gated: bool) -> Lease | None:
    """Claim under the gates: live pauses (in the SQL) and budgets (admit_claim, same transaction).

    Raises ClaimBlocked when a concurrency limit is full (the claim is rolled back and the
    job stays queued). A job whose budget is out of attempts or run time is parked.

    ``gated=False`` (no budget limits concurrency, attempts or run time, as the caller read
    at the start of its pass) claims with the single autocommit statement: one round trip
    instead of four, which is most of a short job's engine cost.
    """
    if not gated:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        return _lease(row) if row else None
    exhausted: BudgetExhausted | None = None
    lease: Lease | None = None
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                row = cursor.fetchone()
            if row is None:
                return None
            lease = _lease(row)
            usage_ids = budgets.admit_claim(job_id=lease.job_id, kind=lease.kind, queue=lease.queue, tenant=lease.tenant)
            lease = replace(lease, budget_usage_ids=tuple(usage_ids))
    except BudgetExhausted as exc:
        exhausted = exc
    if exhausted is not None and lease is not None:
        park_queued(job_id=lease.job_id, reason=ParkReason.BUDGET, detail=exhausted.detail, parked_on=exhausted.parked_on)
        return None
    return lease


def claim_job(
    *, job_id: int, worker: str, lease_seconds: float, served: Sequence[str] | None = None, gated: bool = True
) -> Lease | None:
    """Claim one specific job (the one an RQ message named), if it is still queued, due, not
    paused, and of a "kind@version" in ``served`` (default: every pair this process registers).

    A duplicate delivery finds it running or finished and gets None: a no-op. So does a
    doorbell for a job this worker does not serve; ``misdelivered`` tells that case apart.
    """
    pairs = [k.key for k in kinds.runnable()] if served is None else list(served)
    try:
        return _claim(sql.CLAIM_JOB, {"job_id": job_id, "served": pairs, "worker": worker, "lease": lease_seconds}, gated=gated)
    except ClaimBlocked:
        return None


@dataclass(frozen=True)
class Misdelivery:
    """A doorbell for a due job this worker does not serve, and who else listens on its queue."""

    queue: str
    version: int
    capable: int  # live workers on the queue that serve the job's kind@version
    incapable: int  # live workers on the queue that do not (this one included, when registered)


def misdelivered(*, job_id: int, served: Sequence[str], live_seconds: float) -> Misdelivery | None:
    """After claim_job got None: is ``job_id`` queued and due but of a pair not in ``served``?

    Counts the live workers (a WorkerProcess row seen within ``live_seconds``, not stopped) on
    the job's queue that do and do not serve it, so the caller can pass the doorbell on to a
    capable worker a bounded number of times. None when the job is not queued and due (taken,
    finished, scheduled later) or when this worker serves it (a pause or budget held it back).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql.MISDELIVERED,
            [live_seconds, job_id, list(served)],
        )
        row = cursor.fetchone()
    return Misdelivery(queue=row[0], version=row[1], capable=row[2], incapable=row[3]) if row else None


def claim_next(
    *,
    queue: str,
    served: Sequence[str],
    worker: str,
    lease_seconds: float,
    skip_kinds: Sequence[str] = (),
    gated: bool = True,
) -> Lease | None:
    """Claim the next due job in ``queue`` among the served "kind@version" pairs.

    Raises ClaimBlocked when the picked job's concurrency scope is full; the caller skips
    that kind (or the whole queue) for the rest of its pass.
    """
    return _claim(
        sql.CLAIM_NEXT,
        {"queue": queue, "served": list(served), "worker": worker, "lease": lease_seconds, "skip": list(skip_kinds)},
        gated=gated,
    )


def claim_next_many(
    *, queue: str, served: Sequence[str], worker: str, lease_seconds: float, count: int, skip_kinds: Sequence[str] = ()
) -> list[Lease]:
    """Claim up to ``count`` due jobs of ``queue`` in one statement. Only while no budget gates
    claims (``budgets.claims_are_gated()`` is False): pauses are in the SQL, as in claim_next."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.CLAIM_NEXT_MANY,
            {
                "queue": queue,
                "served": list(served),
                "worker": worker,
                "lease": lease_seconds,
                "skip": list(skip_kinds),
                "n": count,
            },
        )
        rows = cursor.fetchall()
    return [_lease(row) for row in rows]


def park_queued(*, job_id: int, reason: str, detail: str, parked_on: dict[str, Any] | None = None) -> bool:
    """Park a queued job that was never started (a budget refused it at claim time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.PARK_QUEUED,
            [reason, redact_text(detail), json.dumps(parked_on or {}), job_id],
        )
        return cursor.rowcount == 1


def hold_lease(*, job_id: int, lease_token: int) -> Rejection | None:
    """Lock attempt ``lease_token``'s job row for the rest of the current transaction.

    Every attempt-side write to a table other than ``workers_job`` (ledger, export records,
    budgets reserved for a call) calls this first, inside the same transaction; None means the
    lease is live and stays ours until COMMIT. A stalled transaction cannot keep it for long:
    worker sessions end idle transactions (workers/dbsession.py). Why a row lock and not an
    ``EXISTS``: see ``sql.HOLD_LEASE``.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("hold_lease() must run inside transaction.atomic(): the lock lasts until COMMIT")
    with connection.cursor() as cursor:
        cursor.execute(sql.HOLD_LEASE, {"job_id": job_id, "lease_token": lease_token})
        if cursor.fetchone() is not None:
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token)


def rejection_for(*, job_id: int, lease_token: int, reporting: str | None = None) -> Rejection:
    """Why a fenced write by attempt ``lease_token`` matched no row.

    ``reporting`` is the outcome the attempt tried to record; if exactly that is already
    stored for this attempt, the repeat is ``already_recorded`` (the worker treats it as done).
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.REJECTION_FOR, [lease_token, job_id])
        row = cursor.fetchone()
    if row is None:
        return Rejection.LEASE_SUPERSEDED
    state, current_token, my_outcome, requeued_by = row
    # The attempt row is keyed by this token: if it already holds exactly this report, the
    # report landed (its reply was lost), whoever has claimed the job since.
    if reporting is not None and my_outcome == reporting:
        return Rejection.ALREADY_RECORDED
    if state == JobState.CANCELLED:
        return Rejection.JOB_CANCELLED
    if current_token != lease_token:
        return Rejection.LEASE_SUPERSEDED
    # Nobody has claimed the job since. If this attempt already recorded its own end (a report
    # of another outcome after its first landed: fail after complete, complete after a terminal
    # fail), that end stands and the worker has nothing left to do: already_recorded, not
    # lease_expired, which would tell it that the reaper still decides a job that is settled.
    # The reaper's orphaned mark and an operator's requeue are not this attempt's own ends.
    if reporting is not None and my_outcome in _OWN_ENDS and not (my_outcome == Outcome.INTERRUPTED and requeued_by):
        return Rejection.ALREADY_RECORDED
    return Rejection.LEASE_EXPIRED


# Outcomes an attempt records for itself (through _finish), as opposed to the reaper's ORPHANED
# and the CANCELLED an operator's cancel writes.
_OWN_ENDS = (Outcome.SUCCEEDED, Outcome.RETRY, Outcome.FAILED, Outcome.PARKED, Outcome.UNSERVABLE, Outcome.INTERRUPTED)


def heartbeat(*, job_id: int, lease_token: int, lease_seconds: float, progress: dict[str, Any] | None = None) -> Rejection | None:
    """Extend the lease and store a progress checkpoint. None means the lease is still ours."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT,
            {
                "job_id": job_id,
                "lease_token": lease_token,
                "lease_seconds": lease_seconds,
                "progress": json.dumps(progress) if progress is not None else None,
            },
        )
        if cursor.fetchone():
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token)


@dataclass(frozen=True)
class Report:
    """What an attempt reports at its end, besides the outcome."""

    compute_seconds: float = 0.0
    db_wait_seconds: float = 0.0
    storage_wait_seconds: float = 0.0
    usage: dict[str, Any] | None = None


def _finish(
    statement: str,
    *,
    job_id: int,
    lease_token: int,
    outcome: str,
    report: Report,
    error_class: str = "",
    error_message: str = "",
    **job_values: Any,
) -> Rejection | None:
    """Run one of the fenced end-of-attempt statements (sql.COMPLETE … sql.RELEASE)."""
    usage = json.dumps(report.usage or {})
    with connection.cursor() as cursor:
        cursor.execute(
            statement,
            {
                **job_values,
                "job_id": job_id,
                "lease_token": lease_token,
                "usage": usage,
                "outcome": outcome,
                "error_class": error_class[:200],
                "error_message": error_message,
                "compute_seconds": report.compute_seconds,
                "db_wait_seconds": report.db_wait_seconds,
                "storage_wait_seconds": report.storage_wait_seconds,
            },
        )
        if cursor.fetchone():
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token, reporting=outcome)


def complete(
    *, job_id: int, lease_token: int, result: Any = None, state_delta: dict[str, Any] | None = None, report: Report = Report()
) -> Rejection | None:
    """Record success: store the result and merge the state delta into run_state by top-level key."""
    return _finish(
        sql.COMPLETE,
        job_id=job_id,
        lease_token=lease_token,
        outcome=Outcome.SUCCEEDED,
        report=report,
        result=json.dumps(result, default=str),
        state_delta=json.dumps(state_delta or {}, default=str),
    )


def retry_later(
    *, job_id: int, lease_token: int, delay_seconds: float, error_class: str, message: str, report: Report = Report()
) -> Rejection | None:
    """A retryable failure within the attempt budget: back to the queue after ``delay_seconds``."""
    text = redact_text(message)
    return _finish(
        sql.RETRY_LATER,
        job_id=job_id,
        lease_token=lease_token,
        outcome=Outcome.RETRY,
        report=report,
        error_class=error_class,
        error_message=text,
        delay_seconds=delay_seconds,
    )


def fail(
    *, job_id: int, lease_token: int, reason: FailureReason, error_class: str, message: str, report: Report = Report()
) -> Rejection | None:
    """A terminal outcome: typed failure, fatal error or spent attempt budget."""
    text = redact_text(message)
    return _finish(
        sql.FAIL,
        job_id=job_id,
        lease_token=lease_token,
        outcome=Outcome.FAILED,
        report=report,
        error_class=error_class,
        error_message=text,
        reason=reason.value,
    )


def park(
    *, job_id: int, lease_token: int, reason: str, detail: str, parked_on: dict[str, Any] | None = None, report: Report = Report()
) -> Rejection | None:
    """Set the job aside (review, needs attention, budget) without using an attempt; no worker waits."""
    if reason not in ParkReason.values:
        raise ValueError(f"unknown park reason {reason!r}")
    text = redact_text(detail)
    return _finish(
        sql.PARK,
        job_id=job_id,
        lease_token=lease_token,
        outcome=Outcome.PARKED,
        report=report,
        error_message=text,
        reason=reason,
        detail=text,
        parked_on=json.dumps(parked_on or {}, default=str),
    )


def release(*, job_id: int, lease_token: int, outcome: str, message: str = "", delay_seconds: float = 0.0) -> Rejection | None:
    """Give the job back without using an attempt: graceful shutdown or an unservable kind."""
    if outcome not in (Outcome.INTERRUPTED, Outcome.UNSERVABLE):
        raise ValueError(f"release cannot record {outcome!r}")
    return _finish(
        sql.RELEASE,
        job_id=job_id,
        lease_token=lease_token,
        outcome=outcome,
        report=Report(),
        error_message=message,
        delay_seconds=delay_seconds,
    )
