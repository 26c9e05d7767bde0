"""Retention: delete finished jobs, their attempts and what hangs on them after KOALA_RETENTION_DAYS.

So the engine's tables stay the size of the live work (docs/operations.md, "Retention"). The beat
runs ``prune`` every KOALA_RETENTION_INTERVAL_SECONDS; ``koala_prune`` runs one pass by hand.

What is never deleted: a live job (queued, running, parked); a finished job with an open
operation (in flight or uncertain: nobody knows yet whether it happened, so its record stays and
its job with it); a job that a live or young job retries (``retry_of``); what an app keeps
(``workers.hooks.register_retention``: a workflow's live or young run, an unsettled export, an
open review); the audit trail (``koala.AuditEvent`` rows are never touched: they name jobs by id,
as text). A job's idempotency key is free again once its job is pruned: an enqueue with the same
key after the window makes a new job.

Each batch is its own short transaction: pick up to ``batch_size`` prunable jobs, oldest first,
``FOR UPDATE SKIP LOCKED`` (never waiting on a row anyone holds), let the apps keep some and
forget their rows under the others, then delete the rest with their operations and attempts in
one statement. At most ``batches`` batches per pass, so a pass is bounded however large the
backlog: the rest waits for the next pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from workers import hooks, sql

# Before every finished_at: where a pass's keyset starts.
_START = datetime(1970, 1, 1, tzinfo=UTC)


class BadRetention(ValueError):
    """A retention argument out of range (days < 0, batch size or batches < 1)."""


@dataclass(frozen=True)
class PrunePlan:
    """What one pass may do: decided first, from the settings or a command's options."""

    cutoff: datetime
    batch_size: int
    batches: int


@dataclass
class PruneReport:
    jobs: int = 0
    attempts: int = 0
    operations: int = 0
    kept: int = 0  # jobs an app kept (workers.hooks.register_retention)
    batches: int = 0
    apps: dict[str, int] = field(default_factory=dict)  # rows each app deleted or detached

    def loggable(self) -> dict[str, int]:
        return {"jobs": self.jobs, "attempts": self.attempts, "operations": self.operations, "kept": self.kept}


def plan(
    *, days: int | None = None, batch_size: int | None = None, batches: int | None = None, now: datetime | None = None
) -> PrunePlan | None:
    """The pass's plan (None: retention is off, KOALA_RETENTION_DAYS=0). BadRetention for a bad value."""
    days = settings.KOALA_RETENTION_DAYS if days is None else days
    batch_size = settings.KOALA_RETENTION_BATCH_SIZE if batch_size is None else batch_size
    batches = settings.KOALA_RETENTION_BATCHES if batches is None else batches
    if days < 0:
        raise BadRetention(f"retention days must be 0 (keep everything) or more, not {days}")
    if not 1 <= batch_size <= 10_000:
        raise BadRetention(f"batch size must be 1-10000, not {batch_size}")
    if batches < 1:
        raise BadRetention(f"batches must be at least 1, not {batches}")
    if days == 0:
        return None
    return PrunePlan(cutoff=(now or timezone.now()) - timedelta(days=days), batch_size=batch_size, batches=batches)


def prune(
    *,
    days: int | None = None,
    batch_size: int | None = None,
    batches: int | None = None,
    before_batch: Callable[[], None] | None = None,
) -> PruneReport:
    """One bounded pass: up to ``batches`` batches of ``batch_size`` jobs, each its own transaction.
    ``before_batch`` is called before each (``koala_tick prune``: the lease's fence, which raises
    to stop the pass once another run holds the task)."""
    decided = plan(days=days, batch_size=batch_size, batches=batches)
    report = PruneReport()
    if decided is None:
        return report
    after_at, after_id = _START, 0
    for _ in range(decided.batches):
        if before_batch is not None:
            before_batch()
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    sql.PRUNE_PICK,
                    {"cutoff": decided.cutoff, "after_at": after_at, "after_id": after_id, "limit": decided.batch_size},
                )
                picked = cursor.fetchall()
                if not picked:
                    break
                report.batches += 1
                after_at, after_id = picked[-1][1], picked[-1][0]
                ids = [job_id for job_id, _ in picked]
                kept = hooks.retention_keeps(ids, decided.cutoff)
                going = [job_id for job_id in ids if job_id not in kept]
                report.kept += len(kept)
                if going:
                    # The apps' rows first (spans, reviews, exports' links), then the engine's:
                    # the foreign keys are checked at commit, so both land or neither.
                    for name, touched in hooks.retention_forget(going).items():
                        report.apps[name] = report.apps.get(name, 0) + touched
                    cursor.execute(sql.PRUNE_DELETE, {"ids": going})
                    jobs, attempts, operations = cursor.fetchone()
                    report.jobs += jobs
                    report.attempts += attempts
                    report.operations += operations
        if len(picked) < decided.batch_size:
            break
    return report
