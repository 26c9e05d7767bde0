"""The operations dashboard's numbers, read straight from PostgreSQL (R3, R7).

Every figure is one aggregate query over the engine's rows, so what the page shows is what
the database holds at ``now``: backlog depth and the age of the oldest due job per queue,
running and parked counts, completions and error rates over 1 h / 24 h, p50/p95 queue wait
and run time, budgets against their limits, and worker health (healthy, idle, stuck,
crash-looping, lost, crashed, stopped).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from console.charts import BarChart, bar_chart
from console.selectors.jobs import COUNT_CAP
from reviews.models import ReviewRequest, ReviewState
from workers import sql
from workers.models import Budget, Operation, Pause
from workers.selectors.beat import BeatTaskHealth, beat_health

# Worker health and budget bars live with the engine's selectors: the metrics endpoint reads them
# too, and it sits beside the console, not above it.
from workers.selectors.budgets import BudgetBar, budget_bars
from workers.selectors.workers import ContractMismatch, WorkerHealth, contract_mismatches, queue_pauses, worker_health
from workers.services.operations import needing_attention
from workers.services.pauses import active_pauses

HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(hours=24)
WEEK = dt.timedelta(days=7)


@dataclass
class QueueStats:
    queue: str
    depth: int = 0  # queued, due now or later
    due: int = 0  # queued and due now
    oldest_due_id: int | None = None
    oldest_due_at: dt.datetime | None = None
    running: int = 0
    parked: int = 0
    succeeded_1h: int = 0
    failed_1h: int = 0
    succeeded_24h: int = 0
    failed_24h: int = 0
    wait_p50: float | None = None
    wait_p95: float | None = None
    run_p50: float | None = None
    run_p95: float | None = None
    wait_n: int = 0  # attempts in the wait percentiles' sample (the newest SAMPLE of the window)
    run_n: int = 0
    capped: set[str] = field(default_factory=set)  # counts that stopped at COUNT_CAP ("10,000+")
    now: dt.datetime = field(default_factory=timezone.now)
    paused: Pause | None = None  # the live pause holding this queue back (its own, or a global one)

    @property
    def oldest_due_age(self) -> float | None:
        """Seconds the oldest due job has waited: the backlog age an operator watches."""
        return None if self.oldest_due_at is None else max((self.now - self.oldest_due_at).total_seconds(), 0.0)

    @staticmethod
    def _rate(failed: int, succeeded: int) -> float | None:
        total = failed + succeeded
        return None if total == 0 else failed / total

    @property
    def error_rate_1h(self) -> float | None:
        return self._rate(self.failed_1h, self.succeeded_1h)

    @property
    def error_rate_24h(self) -> float | None:
        return self._rate(self.failed_24h, self.succeeded_24h)


@dataclass
class Dashboard:
    now: dt.datetime
    queues: list[QueueStats]
    workers: list[WorkerHealth]
    budgets: list[BudgetBar]
    throughput: BarChart
    errors: BarChart
    cost: BarChart
    uncertain_operations: int
    pending_reviews: int
    overshoots: list[Operation] = field(default_factory=list)
    zone: str = "UTC"  # the charts' time zone (chart_zone)
    # Each beat step's last tick (workers.selectors.beat: one read of a row per step).
    beat: list[BeatTaskHealth] = field(default_factory=list)
    # Kinds live workers serve under different contracts (hosts with different kind modules).
    contract_mismatches: list[ContractMismatch] = field(default_factory=list)

    @property
    def sample_label(self) -> str:
        return f"{SAMPLE:,}"  # the percentiles' sample size, said on the page

    @property
    def count_cap_label(self) -> str:
        return f"{COUNT_CAP:,}"


def _queue_names(extra: Iterable[str]) -> list[str]:
    # Configured queues always show (an empty queue is information too), then any other seen.
    names = list(settings.RQ_QUEUES)
    names += sorted(set(extra) - set(names))
    return names


# Every figure below is one bounded index read, whatever the table holds (issue 9, scenario 7):
# the queue list is a loose index scan (one descent per queue), each live count stops at
# COUNT_CAP (the page then says "10,000+", as the job list does), the oldest due job is the
# first entry of its queue's range, and the percentiles are over the newest SAMPLE attempts.
# The statements, with their planner notes, are the dashboard's section of workers/sql.py.
SAMPLE = 2_000


def _capped(value: int) -> tuple[int, bool]:
    return (COUNT_CAP, True) if value > COUNT_CAP else (value, False)


FinishedRows = list[tuple[str, dt.datetime, bool, int, int]]


def finished_jobs(*, now: dt.datetime) -> FinishedRows:
    """Jobs finished in the last 24 h as (queue, hour, within the last hour, succeeded, failed):
    one index-only read of the window on job_finished_cover_idx (its entries carry state and
    queue) that serves both the per-queue completions and the hourly charts."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_FINISHED_JOBS, {"day": now - DAY, "hour": now - HOUR, "now": now})
        return cursor.fetchall()


def queue_stats(*, now: dt.datetime, finished: FinishedRows | None = None) -> list[QueueStats]:
    stats: dict[str, QueueStats] = defaultdict(lambda: QueueStats(queue="", now=now))

    def row(queue: str) -> QueueStats:
        entry = stats[queue]
        entry.queue = queue
        return entry

    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_LIVE_COUNTS, {"cap": COUNT_CAP + 1, "now": now})
        for queue, depth, due, running, parked, oldest_id, oldest_at in cursor.fetchall():
            if not (depth or running or parked):
                continue  # a queue that only holds old finished jobs shows if its 24 h does
            entry = row(queue)
            for name, value in (("depth", depth), ("due", due), ("running", running), ("parked", parked)):
                shown, capped = _capped(value)
                setattr(entry, name, shown)
                if capped:
                    entry.capped.add(name)
            # The oldest due job by id, so the page links to the very row it measures.
            entry.oldest_due_id, entry.oldest_due_at = oldest_id, oldest_at

        for queue, _hour, last_hour, succeeded, failed in finished if finished is not None else finished_jobs(now=now):
            entry = row(queue)
            entry.succeeded_24h += succeeded
            entry.failed_24h += failed
            if last_hour:
                entry.succeeded_1h += succeeded
                entry.failed_1h += failed

        # Queue wait and run time percentiles, two samples in one round trip (workers.sql says how).
        cursor.execute(sql.DASHBOARD_WAIT_AND_RUN_SAMPLES, {"day": now - DAY, "now": now, "sample": SAMPLE})
        for what, queue, p50, p95, n in cursor.fetchall():
            entry = row(queue)
            if what == "wait":
                entry.wait_p50, entry.wait_p95, entry.wait_n = p50, p95, n
            else:
                entry.run_p50, entry.run_p95, entry.run_n = p50, p95, n

    return [stats[name] if name in stats else QueueStats(queue=name, now=now) for name in _queue_names(stats)]


def overshoots(*, now: dt.datetime, limit: int = 20) -> list[Operation]:
    """Calls billed above their reservation (their upper bound) in the last week, newest first.

    Each one broke the bound a spend cap relies on and paused its budget's scope
    (budgets.pause_overshot); served by operation_overshoot_idx (a handful of rows).
    """
    return list(
        Operation.objects.filter(overshoot_minor__gt=0, settled_at__gte=now - WEEK, settled_at__lte=now)
        .only("id", "job_id", "name", "kind", "target", "estimate_minor", "cost_minor", "overshoot_minor", "settled_at")
        .order_by("-settled_at")[:limit]
    )


def _hourly(rows: Iterable[tuple[dt.datetime, Any]], *, now: dt.datetime) -> list[tuple[dt.datetime, float]]:
    start = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=23)
    buckets = {start + dt.timedelta(hours=i): 0.0 for i in range(24)}
    for hour, value in rows:
        if hour in buckets:
            buckets[hour] += float(value or 0)
    return sorted(buckets.items())


def chart_zone(budgets: Iterable[Budget]) -> ZoneInfo:
    """The charts' time zone: the budgets' own when they all share one (so an hour on a chart and
    a budget's day are on the same clock), else UTC. The charts name the zone they use."""
    zones = {budget.timezone for budget in budgets}
    if len(zones) == 1:
        try:
            return ZoneInfo(zones.pop())
        except (KeyError, ValueError):
            pass
    return ZoneInfo("UTC")


def charts(
    *, now: dt.datetime, finished: FinishedRows | None = None, zone: ZoneInfo | None = None
) -> tuple[BarChart, BarChart, BarChart]:
    """Throughput, errors and cost per hour over the last 24 hours (server-side SVG), the hours
    labelled in ``zone`` (UTC by default), the cost in KOALA_COST_CURRENCY (major units)."""
    since = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=23)
    # The jobs' window starts at now - 24 h, a little before since: _hourly drops that hour.
    jobs = [
        (hour, succeeded, failed)
        for _, hour, _, succeeded, failed in (finished if finished is not None else finished_jobs(now=now))
    ]
    with connection.cursor() as cursor:
        # Retried/orphaned attempts and cost per hour: one statement, one round trip.
        cursor.execute(sql.DASHBOARD_HOURLY_RETRIES_AND_COST, {"since": since, "now": now})
        hourly = cursor.fetchall()
    retries = [(hour, value) for what, hour, value in hourly if what == "retries"]
    cost = [(hour, value) for what, hour, value in hourly if what == "cost"]
    throughput = bar_chart(
        title="Completed jobs per hour",
        series=[("succeeded", _hourly(((h, s) for h, s, _ in jobs), now=now))],
        unit="jobs",
        whole=True,
        zone=zone,
    )
    errors = bar_chart(
        title="Errors per hour",
        series=[
            ("failed jobs", _hourly(((h, f) for h, _, f in jobs), now=now)),
            ("retried or orphaned attempts", _hourly(retries, now=now)),
        ],
        unit="errors",
        whole=True,
        zone=zone,
    )
    # Costs are minor units of KOALA_COST_CURRENCY; the chart shows major units, as budgets do.
    currency = settings.KOALA_COST_CURRENCY
    spend = bar_chart(
        title=f"Cost per hour ({currency})",
        series=[("cost", [(hour, value / 100) for hour, value in _hourly(cost, now=now)])],
        unit=currency,
        zone=zone,
    )
    return throughput, errors, spend


def build_dashboard(*, now: dt.datetime | None = None) -> Dashboard:
    now = now or timezone.now()
    # savepoint=False: inside a request's transaction this joins it (SET LOCAL then lasts to its end).
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        # No JIT and no parallel workers for the page's bounded index reads (workers.sql says why);
        # SET LOCAL ends with this block.
        cursor.execute(sql.DASHBOARD_SESSION)
        return _build(now)


def _build(now: dt.datetime) -> Dashboard:
    finished = finished_jobs(now=now)
    budgets = budget_bars(now=now)
    zone = chart_zone(bar.budget for bar in budgets)
    throughput, errors, cost = charts(now=now, finished=finished, zone=zone)
    queues = queue_stats(now=now, finished=finished)
    pauses = active_pauses()
    held = queue_pauses(pauses, (q.queue for q in queues))
    for stats in queues:
        stats.paused = held.get(stats.queue)
    return Dashboard(
        now=now,
        queues=queues,
        workers=worker_health(now=now, due={q.queue: q.due for q in queues}, pauses=pauses),
        budgets=budgets,
        throughput=throughput,
        errors=errors,
        cost=cost,
        uncertain_operations=needing_attention().count(),
        pending_reviews=ReviewRequest.objects.filter(state=ReviewState.PENDING).count(),
        overshoots=overshoots(now=now),
        zone=str(zone),
        beat=beat_health(now=now),
        contract_mismatches=contract_mismatches(now=now),
    )
