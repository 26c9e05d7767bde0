"""The beat's work: reap expired leases, fail jobs past their deadline, re-ring the doorbell.

Every step is a conditional UPDATE, so any number of koala_beat replicas can run at
once: a row changes once, whichever replica gets there first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from workers import doorbell, hooks
from workers.services.pauses import LIVE_PAUSE_SQL

# Dispatch does not wake workers for jobs a live pause holds back.
_NOT_PAUSED = (
    "NOT EXISTS (SELECT 1 FROM workers_pause p WHERE "
    + LIVE_PAUSE_SQL.format(queue="workers_job.queue", kind="workers_job.kind")
    + ")"
)


# The queues with queued jobs, then each queue's first due jobs in claim order.
#
# Planner note. ``SELECT DISTINCT queue FROM workers_job WHERE state = 'queued'`` reads every
# queued row (an index-only scan of all of job_claim_idx: 76 ms with 200k queued jobs, on every
# beat tick). PostgreSQL 15 has no skip scan, so the recursive CTE does one by hand (a "loose
# index scan"): each step asks job_claim_idx, whose leading column is queue, for the first
# queue after the previous one, one index descent per queue: O(queues * log rows).
# The due check stays in the LATERAL, exactly where it was: a queue whose jobs are all
# delayed yields no row there, as it yielded none from the DISTINCT before.
_DISPATCH_SQL = (
    """
WITH RECURSIVE queues(queue) AS (
    (SELECT queue FROM workers_job WHERE state = 'queued' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM workers_job j WHERE j.state = 'queued' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
)
SELECT q.queue, d.id, d.version
FROM queues q
CROSS JOIN LATERAL (
    SELECT id, version FROM workers_job
    WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= now() AND """
    + _NOT_PAUSED
    + """
    ORDER BY priority DESC, scheduled_at, id LIMIT %s
) d
WHERE q.queue IS NOT NULL
"""
)


@dataclass(frozen=True)
class ReapReport:
    orphaned: int
    requeued: int
    failed: int
    deadline_failed: int


def reap(*, grace_seconds: float | None = None) -> ReapReport:
    """Expired lease → attempt orphaned. After the grace period: at_least_once requeues
    (if attempts remain), at_most_once fails with reason ``orphaned``."""
    grace = settings.KOALA_ORPHAN_GRACE_SECONDS if grace_seconds is None else grace_seconds
    # Each statement takes its jobs FOR UPDATE SKIP LOCKED: a job whose row a stalled attempt
    # (or another beat replica) has locked is left for a later tick instead of waited for, so a
    # partitioned worker or a partitioned beat can never stall the reaper. The row locks taken
    # here last until COMMIT, so the requeue and fail statements below act on the same rows the
    # first one orphaned, and a concurrent replica skips them.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            WITH expired AS (
                SELECT id, lease_token, lease_expires_at FROM workers_job
                WHERE state = 'running' AND lease_expires_at < now()
                FOR NO KEY UPDATE SKIP LOCKED
            )
            UPDATE workers_attempt a
            SET outcome = 'orphaned', finished_at = now(),
                error_message = 'lease expired at '
                    || to_char(j.lease_expires_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ' without a report'
            FROM expired j
            WHERE a.job_id = j.id AND a.lease_token = j.lease_token AND a.finished_at IS NULL
            """
        )
        orphaned = cursor.rowcount
        cursor.execute(
            """
            UPDATE workers_job
            SET state = 'queued', scheduled_at = now(), lease_holder = NULL, lease_expires_at = NULL, updated_at = now(),
                error_class = 'LeaseExpired', error_message = 'the previous attempt''s lease expired; requeued'
            WHERE id IN (
                SELECT id FROM workers_job
                WHERE state = 'running' AND lease_expires_at < now() - make_interval(secs => %s)
                  AND delivery = 'at_least_once' AND attempts < max_attempts
                  AND (deadline_at IS NULL OR deadline_at > now())
                FOR NO KEY UPDATE SKIP LOCKED
            ) AND state = 'running'
            RETURNING id, queue, version
            """,
            [grace],
        )
        requeued_rows = cursor.fetchall()
        cursor.execute(
            """
            UPDATE workers_job
            SET state = 'failed', failure_reason = 'orphaned', lease_holder = NULL, lease_expires_at = NULL,
                finished_at = now(), updated_at = now(), error_class = 'LeaseExpired',
                error_message = CASE WHEN delivery = 'at_most_once'
                    THEN 'lease expired; at_most_once does not run a body twice'
                    ELSE 'lease expired and no attempts or time remain' END
            WHERE id IN (
                SELECT id FROM workers_job
                WHERE state = 'running' AND lease_expires_at < now() - make_interval(secs => %s)
                FOR NO KEY UPDATE SKIP LOCKED
            ) AND state = 'running'
            """,
            [grace],
        )
        failed = cursor.rowcount
        cursor.execute(
            """
            UPDATE workers_job
            SET state = 'failed', failure_reason = 'deadline_exceeded', finished_at = now(), updated_at = now(),
                error_class = 'DeadlineExceeded', error_message = 'the job''s overall deadline passed before it ran'
            WHERE id IN (
                SELECT id FROM workers_job
                WHERE state = 'queued' AND deadline_at IS NOT NULL AND deadline_at <= now()
                FOR NO KEY UPDATE SKIP LOCKED
            ) AND state = 'queued'
            """
        )
        deadline_failed = cursor.rowcount
        by_queue: dict[str, list[tuple[int, int]]] = {}
        for job_id, queue, version in requeued_rows:
            by_queue.setdefault(queue, []).append((job_id, version))
        transaction.on_commit(lambda: [doorbell.ring(q, jobs) for q, jobs in by_queue.items()])
    return ReapReport(orphaned=orphaned, requeued=len(requeued_rows), failed=failed, deadline_failed=deadline_failed)


def dispatch(*, depth: int | None = None) -> int:
    """Ring the doorbell for every queue with due jobs, from database state alone.

    This is what makes Redis disposable: after a restart or FLUSHALL the queues are
    empty, and the next tick pushes messages for the oldest due jobs again. Pushing
    when a message already exists is harmless (a duplicate delivery is a no-op).
    """
    limit = settings.KOALA_DOORBELL_DEPTH if depth is None else depth
    with connection.cursor() as cursor:
        cursor.execute(_DISPATCH_SQL, [limit])
        rows = cursor.fetchall()
    by_queue: dict[str, list[tuple[int, int]]] = {}
    for queue, job_id, version in rows:
        by_queue.setdefault(queue, []).append((job_id, version))
    # Aim for one pending message per due job (up to the depth): fewer would leave
    # workers idle, more would only wake them for nothing.
    return sum(doorbell.ring(queue, jobs, depth=len(jobs)) for queue, jobs in by_queue.items())


@dataclass(frozen=True)
class SafetyReport:
    pauses_lifted: int
    unparked: int
    breakers_tripped: list[str]
    # What each app's beat task (workers.hooks.register_beat_task) returned, by task name:
    # e.g. {"reviews": {"expired": 1}, "exports": {"settled": 0, "temp_objects_removed": 2}}.
    tasks: dict[str, Any] = field(default_factory=dict)


def safety_tick() -> SafetyReport:
    """The safety layer's periodic work: expired pauses lift, budget-parked jobs resume when
    their budget has room, and the circuit breaker trips; then each app's beat task runs
    (undecided reviews end their job, exports settle), in the order the apps registered them.

    A task that raises ends the tick, as the engine's own steps do: the beat logs it and the
    next tick runs everything again (each step is idempotent)."""
    from workers.services import budgets, pauses

    lifted = pauses.lift_expired()
    if lifted:
        transaction.on_commit(dispatch)
    unparked = budgets.unpark_ready()
    tripped = [p.target for p in pauses.trip_breakers()]
    return SafetyReport(
        pauses_lifted=lifted,
        unparked=unparked,
        breakers_tripped=tripped,
        tasks={task.name: task.run() for task in hooks.beat_tasks()},
    )
