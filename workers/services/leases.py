"""Lease services: claim, heartbeat, complete, fail, release. The machine loop.

Every write after the claim names the attempt's fencing token:
``UPDATE … WHERE id = %s AND lease_token = %s AND state = 'running' …``.
Zero rows means the attempt is stale; ``rejection_for`` then names why, from the
closed set in ``workers.errors.Rejection``. Never check-then-write: the row count
of the conditional write is the decision.

These run once or twice per job, so they are hand-written SQL (one statement, one
commit each) rather than ORM sequences: the engine's whole overhead per job is
enqueue + claim + complete = three commits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from koala.redaction import redact_text
from workers import kinds
from workers.errors import Rejection
from workers.models import FailureReason, JobState, Outcome, ParkReason
from workers.services import budgets
from workers.services.budgets import BudgetExhausted, ClaimBlocked
from workers.services.pauses import LIVE_PAUSE_SQL


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


_LEASE_COLUMNS = (
    "c.id, a.id, c.kind, c.version, c.queue, c.input, c.run_state, c.progress, c.lease_token, c.attempts, "
    "c.max_attempts, c.delivery, c.timeout_seconds, c.deadline_at, c.correlation_id, c.trace_id, c.idempotency_key, "
    "c.created_by, c.operation_key_base"
)

# Planner note. Fenced writes and the claim's UPDATE find their row by primary key; their
# state checks are written ``state IS NOT DISTINCT FROM '…'`` (for this NOT NULL column it
# means exactly ``=``) because no index can serve that form. With ``=`` and statistics taken
# when few jobs were queued or running (a burst of enqueues after a quiet period, a new or
# truncated table), PostgreSQL picked job_state_created_idx (or a partial index on state)
# and filtered every queued/running row for the id, so each claim was O(queue length):
# 6.4 ms instead of 2.2 ms per claim with 5,000 queued jobs (bench/README.md).
_QUEUED = "state IS NOT DISTINCT FROM 'queued'"

# One statement claims the row (the conditional UPDATE whose row count decides the winner),
# bumps the fencing token and inserts the attempt, so claim and attempt commit together.
# ``queued`` is the picking query's state check: ``state = 'queued'`` when it must walk
# job_claim_idx in order (claim_next), _QUEUED when the id is known (claim_job).
_CLAIM_SQL = (
    """
WITH picked AS (
    SELECT id FROM workers_job
    WHERE {where} AND {queued} AND scheduled_at <= now()
      AND (deadline_at IS NULL OR deadline_at > now())
      AND NOT EXISTS (SELECT 1 FROM workers_pause p WHERE {paused})
    ORDER BY priority DESC, scheduled_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT 1
), c AS (
    UPDATE workers_job j
    SET state = 'running', lease_token = j.lease_token + 1, lease_holder = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s), heartbeat_at = now(),
        attempts = j.attempts + 1, updated_at = now()
    WHERE j.id = (SELECT id FROM picked) AND j.state IS NOT DISTINCT FROM 'queued'
    RETURNING j.*
), a AS (
    INSERT INTO workers_attempt
        (job_id, number, worker_id, lease_token, started_at, heartbeat_at, usage, error_class, error_message)
    SELECT c.id, (SELECT count(*) FROM workers_attempt x WHERE x.job_id = c.id) + 1, %(worker)s, c.lease_token,
           now(), now(), '{{}}', '', ''
    FROM c
    RETURNING id, job_id
)
SELECT """
    + _LEASE_COLUMNS
    + " FROM c JOIN a ON a.job_id = c.id"
)

_PAUSED = LIVE_PAUSE_SQL.format(queue="workers_job.queue", kind="workers_job.kind")
# The claim by id filters on what this worker serves, exactly like claim_next: a doorbell can
# reach any worker listening on the queue (during a rolling deploy, one without the job's
# version), and a worker that claimed such a job could only hand it back as unservable,
# pushing it back by a backoff while a capable worker sat idle.
_CLAIM_JOB_SQL = _CLAIM_SQL.format(
    where="id = %(job_id)s AND (kind || '@' || version) = ANY(%(served)s)", queued=_QUEUED, paused=_PAUSED
)
_CLAIM_NEXT_SQL = _CLAIM_SQL.format(
    where="queue = %(queue)s AND (kind || '@' || version) = ANY(%(served)s) AND kind <> ALL(%(skip)s)",
    queued="state = 'queued'",
    paused=_PAUSED,
)


def _json(value: Any) -> Any:
    # Django registers a jsonb loader that returns text (it decodes in from_db_value).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _lease(row: Sequence[Any]) -> Lease:
    values = list(row)
    for index in (5, 6, 7):  # input, run_state, progress
        values[index] = _json(values[index])
    return Lease(*values)


def _claim(sql: str, params: dict[str, Any], *, gated: bool) -> Lease | None:
    """Claim under the gates: live pauses (in the SQL) and budgets (admit_claim, same transaction).

    Raises ClaimBlocked when a concurrency limit is full (the claim is rolled back and the
    job stays queued). A job whose budget is out of attempts or run time is parked.

    ``gated=False`` (no budget limits concurrency, attempts or run time, as the caller read
    at the start of its pass) claims with the single autocommit statement: one round trip
    instead of four, which is most of a short job's engine cost.
    """
    if not gated:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return _lease(row) if row else None
    exhausted: BudgetExhausted | None = None
    lease: Lease | None = None
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
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
    pairs = [k.key for k in kinds.served()] if served is None else list(served)
    try:
        return _claim(_CLAIM_JOB_SQL, {"job_id": job_id, "served": pairs, "worker": worker, "lease": lease_seconds}, gated=gated)
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
            """
            SELECT j.queue, j.version,
                   count(w.name) FILTER (WHERE w.kinds ? (j.kind || '@' || j.version)),
                   count(w.name) FILTER (WHERE NOT w.kinds ? (j.kind || '@' || j.version))
            FROM workers_job j
            LEFT JOIN workers_workerprocess w
              ON w.stopped_at IS NULL AND w.last_seen_at > now() - make_interval(secs => %s) AND w.queues ? j.queue
            WHERE j.id = %s AND j.state = 'queued' AND j.scheduled_at <= now()
              AND NOT (j.kind || '@' || j.version) = ANY(%s)
            GROUP BY j.id
            """,
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
        _CLAIM_NEXT_SQL,
        {"queue": queue, "served": list(served), "worker": worker, "lease": lease_seconds, "skip": list(skip_kinds)},
        gated=gated,
    )


def park_queued(*, job_id: int, reason: str, detail: str, parked_on: dict[str, Any] | None = None) -> bool:
    """Park a queued job that was never started (a budget refused it at claim time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workers_job SET state = 'parked', park_reason = %s, park_detail = %s, parked_on = %s::jsonb, "
            "parked_at = now(), updated_at = now() WHERE id = %s AND " + _QUEUED,
            [reason, redact_text(detail), json.dumps(parked_on or {}), job_id],
        )
        return cursor.rowcount == 1


# The strict fence. Under READ COMMITTED an ``EXISTS (…lease_token = mine…)`` inside an INSERT
# into another table is evaluated on the statement's snapshot and locks nothing: the reaper can
# requeue the job and a new attempt claim it while this transaction is still open, and its
# COMMIT then lands for a stale attempt. Locking the job row closes that window: the claim, the
# reaper and every lease transition UPDATE that row, so none of them can change it until this
# transaction ends (they skip it — FOR UPDATE SKIP LOCKED — rather than wait), and the WHERE is
# re-checked on the newest row version after any wait (EvalPlanQual). NO KEY UPDATE, not SHARE:
# the lock is held to write on the job's behalf, and it does not block inserts that reference
# the job (attempts, operations) by foreign key.
_HOLD_LEASE_SQL = (
    "SELECT 1 FROM workers_job WHERE id = %s AND lease_token = %s AND state IS NOT DISTINCT FROM 'running' "
    "AND lease_expires_at > now() FOR NO KEY UPDATE"
)


def hold_lease(*, job_id: int, lease_token: int) -> Rejection | None:
    """Lock attempt ``lease_token``'s job row for the rest of the current transaction.

    Every attempt-side write to a table other than ``workers_job`` (ledger, export records,
    budgets reserved for a call) calls this first, inside the same transaction; None means the
    lease is live and stays ours until COMMIT. A stalled transaction cannot keep it for long:
    worker sessions end idle transactions (workers/dbsession.py).
    """
    if not connection.in_atomic_block:
        raise RuntimeError("hold_lease() must run inside transaction.atomic(): the lock lasts until COMMIT")
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_LEASE_SQL, [job_id, lease_token])
        if cursor.fetchone() is not None:
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token)


def rejection_for(*, job_id: int, lease_token: int, reporting: str | None = None) -> Rejection:
    """Why a fenced write by attempt ``lease_token`` matched no row.

    ``reporting`` is the outcome the attempt tried to record; if exactly that is already
    stored for this attempt, the repeat is ``already_recorded`` (the worker treats it as done).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.state, j.lease_token, a.outcome FROM workers_job j "
            "LEFT JOIN workers_attempt a ON a.job_id = j.id AND a.lease_token = %s WHERE j.id = %s",
            [lease_token, job_id],
        )
        row = cursor.fetchone()
    if row is None:
        return Rejection.LEASE_SUPERSEDED
    state, current_token, my_outcome = row
    # The attempt row is keyed by this token: if it already holds exactly this report, the
    # report landed (its reply was lost), whoever has claimed the job since.
    if reporting is not None and my_outcome == reporting:
        return Rejection.ALREADY_RECORDED
    if state == JobState.CANCELLED:
        return Rejection.JOB_CANCELLED
    if current_token != lease_token:
        return Rejection.LEASE_SUPERSEDED
    return Rejection.LEASE_EXPIRED


def heartbeat(*, job_id: int, lease_token: int, lease_seconds: float, progress: dict[str, Any] | None = None) -> Rejection | None:
    """Extend the lease and store a progress checkpoint. None means the lease is still ours."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH j AS (
                UPDATE workers_job
                SET lease_expires_at = now() + make_interval(secs => %s), heartbeat_at = now(),
                    progress = COALESCE(%s::jsonb, progress), updated_at = now()
                WHERE id = %s AND lease_token = %s AND state IS NOT DISTINCT FROM 'running' AND lease_expires_at > now()
                RETURNING id
            )
            UPDATE workers_attempt SET heartbeat_at = now()
            WHERE job_id = (SELECT id FROM j) AND lease_token = %s
            RETURNING id
            """,
            [lease_seconds, json.dumps(progress) if progress is not None else None, job_id, lease_token, lease_token],
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


def _settle(
    *,
    job_id: int,
    lease_token: int,
    job_set: str,
    job_params: list[Any],
    outcome: str,
    report: Report,
    error_class: str = "",
    error_message: str = "",
) -> Rejection | None:
    usage = report.usage or {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH j AS (
                UPDATE workers_job
                SET {job_set}, lease_holder = NULL, lease_expires_at = NULL, updated_at = now(),
                    usage = usage || (SELECT COALESCE(jsonb_object_agg(k, COALESCE((usage->>k)::numeric, 0) + v::numeric), '{{}}')
                                      FROM jsonb_each_text(%s::jsonb) AS u(k, v))
                WHERE id = %s AND lease_token = %s AND state IS NOT DISTINCT FROM 'running' AND lease_expires_at > now()
                RETURNING id
            )
            UPDATE workers_attempt
            SET outcome = %s, finished_at = now(), error_class = %s, error_message = %s, compute_seconds = %s,
                db_wait_seconds = %s, storage_wait_seconds = %s, usage = %s::jsonb
            WHERE job_id = (SELECT id FROM j) AND lease_token = %s
            RETURNING id
            """,
            [
                *job_params,
                json.dumps(usage),
                job_id,
                lease_token,
                outcome,
                error_class[:200],
                error_message,
                report.compute_seconds,
                report.db_wait_seconds,
                report.storage_wait_seconds,
                json.dumps(usage),
                lease_token,
            ],
        )
        if cursor.fetchone():
            return None
    return rejection_for(job_id=job_id, lease_token=lease_token, reporting=outcome)


def complete(
    *, job_id: int, lease_token: int, result: Any = None, state_delta: dict[str, Any] | None = None, report: Report = Report()
) -> Rejection | None:
    """Record success: store the result and merge the state delta into run_state by top-level key."""
    return _settle(
        job_id=job_id,
        lease_token=lease_token,
        job_set="state = 'succeeded', result = %s::jsonb, run_state = run_state || %s::jsonb, finished_at = now()",
        job_params=[json.dumps(result, default=str), json.dumps(state_delta or {}, default=str)],
        outcome=Outcome.SUCCEEDED,
        report=report,
    )


def retry_later(
    *, job_id: int, lease_token: int, delay_seconds: float, error_class: str, message: str, report: Report = Report()
) -> Rejection | None:
    """A retryable failure within the attempt budget: back to the queue after ``delay_seconds``."""
    text = redact_text(message)
    return _settle(
        job_id=job_id,
        lease_token=lease_token,
        job_set="state = 'queued', scheduled_at = now() + make_interval(secs => %s), error_class = %s, error_message = %s",
        job_params=[delay_seconds, error_class[:200], text],
        outcome=Outcome.RETRY,
        report=report,
        error_class=error_class,
        error_message=text,
    )


def fail(
    *, job_id: int, lease_token: int, reason: FailureReason, error_class: str, message: str, report: Report = Report()
) -> Rejection | None:
    """A terminal outcome: typed failure, fatal error or spent attempt budget."""
    text = redact_text(message)
    return _settle(
        job_id=job_id,
        lease_token=lease_token,
        job_set="state = 'failed', failure_reason = %s, error_class = %s, error_message = %s, finished_at = now()",
        job_params=[reason.value, error_class[:200], text],
        outcome=Outcome.FAILED,
        report=report,
        error_class=error_class,
        error_message=text,
    )


def park(
    *, job_id: int, lease_token: int, reason: str, detail: str, parked_on: dict[str, Any] | None = None, report: Report = Report()
) -> Rejection | None:
    """Set the job aside (review, needs attention, budget) without using an attempt; no worker waits."""
    if reason not in ParkReason.values:
        raise ValueError(f"unknown park reason {reason!r}")
    text = redact_text(detail)
    return _settle(
        job_id=job_id,
        lease_token=lease_token,
        job_set="state = 'parked', attempts = attempts - 1, park_reason = %s, park_detail = %s, parked_on = %s::jsonb, "
        "parked_at = now()",
        job_params=[reason, text, json.dumps(parked_on or {}, default=str)],
        outcome=Outcome.PARKED,
        report=report,
        error_message=text,
    )


def release(*, job_id: int, lease_token: int, outcome: str, message: str = "", delay_seconds: float = 0.0) -> Rejection | None:
    """Give the job back without using an attempt: graceful shutdown or an unservable kind."""
    if outcome not in (Outcome.INTERRUPTED, Outcome.UNSERVABLE):
        raise ValueError(f"release cannot record {outcome!r}")
    return _settle(
        job_id=job_id,
        lease_token=lease_token,
        job_set="state = 'queued', attempts = attempts - 1, scheduled_at = now() + make_interval(secs => %s)",
        job_params=[delay_seconds],
        outcome=outcome,
        report=Report(),
        error_message=message,
    )
