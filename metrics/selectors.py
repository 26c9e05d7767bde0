"""One scrape's numbers, read in one read-only REPEATABLE READ transaction: every figure is of
the same moment (a completion counted in koala_job_completions_total is also gone from
koala_jobs{state="running"}). Reads only; the statements are workers/sql.py's metrics section.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max, Min, Sum
from django.utils import timezone

from metrics.models import FoldMark, RejectionEvent, RejectionTally
from metrics.services import BUCKETS, MARK
from reviews.models import ReviewRequest, ReviewState
from schedules.selectors import list_schedules
from workers import sql
from workers.models import BeatTask, PauseSource
from workers.selectors.budgets import budget_bars, running_in_scope
from workers.selectors.workers import worker_health
from workers.services.operations import needing_attention
from workers.services.pauses import active_pauses


@dataclass(frozen=True)
class BudgetLine:
    budget: str
    resource: str  # spend | requests | concurrency
    currency: str  # "" except for spend
    used: float
    limit: float | None


@dataclass
class Snapshot:
    now: dt.datetime
    queues: list[str] = field(default_factory=list)  # every known queue (configured, then seen)
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state) -> count
    due: dict[str, int] = field(default_factory=dict)
    oldest_due: dict[str, dt.datetime] = field(default_factory=dict)
    parked: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, reason)
    orphaned_leases: int = 0
    completions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (queue, kind, outcome)
    failures: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (queue, kind, reason)
    durations: dict[tuple[str, str], tuple[list[int], float]] = field(default_factory=dict)  # (kind, part) -> (per bucket, sum)
    rejections: dict[str, int] = field(default_factory=dict)
    budgets: list[BudgetLine] = field(default_factory=list)
    reviews_pending: int = 0
    review_oldest: dt.datetime | None = None
    operations_attention: int = 0
    workers: dict[str, int] = field(default_factory=dict)  # state -> processes
    last_attempt: dt.datetime | None = None
    last_operation: dt.datetime | None = None
    breaker_trips: dict[str, int] = field(default_factory=dict)  # kind -> trips ever
    breaker_tripped: dict[str, int] = field(default_factory=dict)  # kind -> 1 while live
    pauses: dict[str, int] = field(default_factory=dict)  # scope -> live pauses
    beat_last_tick: dt.datetime | None = None
    schedule_last: dict[str, dt.datetime | None] = field(default_factory=dict)
    schedule_next: dict[str, dt.datetime | None] = field(default_factory=dict)
    folded_before: dt.datetime | None = None
    folded_at: dt.datetime | None = None


def _queues(seen: Iterable[str]) -> list[str]:
    names = list(settings.RQ_QUEUES)
    return names + sorted(set(seen) - set(names))


def _limit(value: int | None) -> float | None:
    return None if value is None else float(value)


def snapshot() -> Snapshot:
    """Koala's truth for one scrape. Opens its own transaction (it must be the first statement's)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.METRICS_SNAPSHOT_BEGIN)
        cursor.execute(sql.METRICS_SNAPSHOT_SESSION)
        mark = FoldMark.objects.filter(name=MARK).first()  # the snapshot's first read
        now = timezone.now()
        snap = Snapshot(now=now)
        if mark is not None:
            snap.folded_before, snap.folded_at = mark.folded_before, mark.folded_at
        seen: set[str] = set()

        cursor.execute(sql.METRICS_QUEUED, {"now": now})
        for queue, count, due, oldest in cursor.fetchall():
            seen.add(queue)
            snap.jobs[(queue, "queued")] = count
            snap.due[queue] = due
            if oldest is not None:
                snap.oldest_due[queue] = oldest
        cursor.execute(sql.METRICS_RUNNING_PARKED, {"now": now})
        for queue, state, reason, count, expired in cursor.fetchall():
            seen.add(queue)
            snap.jobs[(queue, state)] = snap.jobs.get((queue, state), 0) + count
            if state == "parked" and reason:
                snap.parked[(queue, reason)] = count
            snap.orphaned_leases += expired
        cursor.execute(sql.METRICS_KEPT)
        for queue, state, count in cursor.fetchall():
            seen.add(queue)
            snap.jobs[(queue, state)] = count

        cursor.execute(sql.METRICS_COMPLETIONS)
        snap.completions = {(q, k, o): n for q, k, o, n in cursor.fetchall()}
        cursor.execute(sql.METRICS_FAILURES)
        snap.failures = {(q, k, r): n for q, k, r, n in cursor.fetchall()}
        cursor.execute(sql.METRICS_DURATIONS, {"bounds": list(BUCKETS)})
        for kind, part, bucket, n, total in cursor.fetchall():
            counts, running_sum = snap.durations.get((kind, part), ([0] * (len(BUCKETS) + 1), 0.0))
            counts[min(int(bucket), len(BUCKETS))] += n
            snap.durations[(kind, part)] = (counts, running_sum + float(total or 0.0))
        cursor.execute(sql.METRICS_LAST_ENDS)
        snap.last_attempt, snap.last_operation = cursor.fetchone()
        cursor.execute(sql.METRICS_BREAKER_TRIPS)
        for kind, trips, live in cursor.fetchall():
            snap.breaker_trips[kind] = trips
            snap.breaker_tripped[kind] = 1 if live else 0

        snap.queues = _queues(seen)
        for tally in RejectionTally.objects.all():
            snap.rejections[tally.reason] = tally.count
        for reason, n in RejectionEvent.objects.values("reason").annotate(n=Sum("count")).values_list("reason", "n"):
            snap.rejections[reason] = snap.rejections.get(reason, 0) + int(n)

        for bar in budget_bars(now=now):
            name, currency = bar.budget.name, bar.budget.currency
            spend = next(used for what, used, _ in bar.rows if what == "spend")
            requests = next(used for what, used, _ in bar.rows if what == "requests")
            snap.budgets.append(BudgetLine(name, "spend", currency, float(spend), _limit(bar.budget.spend_limit_minor)))
            snap.budgets.append(BudgetLine(name, "requests", "", float(requests), _limit(bar.budget.request_limit)))
            running = running_in_scope(bar.budget)
            snap.budgets.append(BudgetLine(name, "concurrency", "", float(running), _limit(bar.budget.concurrency_limit)))

        pending = ReviewRequest.objects.filter(state=ReviewState.PENDING).aggregate(n=Count("id"), oldest=Min("created_at"))
        snap.reviews_pending, snap.review_oldest = pending["n"], pending["oldest"]
        snap.operations_attention = needing_attention().count()

        snap.workers = {}
        for worker in worker_health(now=now, due=snap.due):
            snap.workers[worker.status] = snap.workers.get(worker.status, 0) + 1

        for pause in active_pauses():
            snap.pauses[pause.scope] = snap.pauses.get(pause.scope, 0) + 1
            if pause.source == PauseSource.CIRCUIT_BREAKER and pause.scope == "kind":
                snap.breaker_tripped[pause.target] = 1

        # The newest step any beat replica finished (one row per step: a handful).
        snap.beat_last_tick = BeatTask.objects.aggregate(last=Max("last_finished_at"))["last"]

        for schedule in list_schedules():
            snap.schedule_last[schedule.name] = schedule.last_slot_at
            snap.schedule_next[schedule.name] = schedule.next_slot_at
        return snap
