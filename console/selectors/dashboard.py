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
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from console.charts import BarChart, bar_chart
from console.selectors.jobs import COUNT_CAP
from reviews.models import ReviewRequest, ReviewState
from workers import sql
from workers.models import (
    ABNORMAL_EXITS,
    Attempt,
    Budget,
    BudgetUsage,
    Operation,
    Pause,
    Scope,
    WorkerExit,
    WorkerProcess,
)
from workers.selectors.beat import BeatTaskHealth, beat_health
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
class WorkerHealth:
    name: str
    hostname: str
    queues: list[str]
    status: str  # healthy | idle | stuck | crash_looping | lost | crashed | stopped
    why: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    live_job_id: int | None = None
    last_completed: Attempt | None = None
    last_operation: Operation | None = None


@dataclass
class BudgetBar:
    budget: Budget
    period: dt.date
    usage: BudgetUsage | None
    rows: list[tuple[str, int | float, int | None]]  # (what, used, limit)


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


def oldest_due(*, now: dt.datetime) -> dict[str, dt.datetime]:
    """The scheduled_at of each queue's oldest due job: one probe of job_queued_due_idx per queue."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_OLDEST_DUE, {"now": now})
        return dict(cursor.fetchall())


def queue_pauses(pauses: Iterable[Pause], queues: Iterable[str]) -> dict[str, Pause]:
    """The live pause holding each queue back: a global one, else the queue's own (kind pauses
    hold some jobs of a queue, not the queue)."""
    # A tenant's pause holds some of a queue's jobs, not the queue: it shows in the banner only.
    pauses = [p for p in pauses if not p.tenant]
    everything = next((p for p in pauses if p.scope == Scope.GLOBAL), None)
    own = {p.target: p for p in pauses if p.scope == Scope.QUEUE}
    held = {queue: everything or own.get(queue) for queue in queues}
    return {queue: pause for queue, pause in held.items() if pause is not None}


def worker_health(
    *, now: dt.datetime, due: dict[str, int] | None = None, pauses: list[Pause] | None = None
) -> list[WorkerHealth]:
    """Tell a crash loop from a stuck worker (R3): a live process can be stuck.

    - crash_looping: KOALA_CRASH_LOOP_STARTS or more abnormal exits of one host and queue set
      within KOALA_CRASH_LOOP_WINDOW_SECONDS. Abnormal: a process that left on an unhandled
      error (it recorded ``crashed``), one that recorded no exit and was found dead by the
      next start under its name (``died``), or one still silent past a lease (``lost``, not
      yet restarted). Clean stops (SIGTERM, Ctrl-C, --burst) never count, however many;
    - lost: not stopped, but silent for longer than a lease (killed, host gone);
    - crashed: left its loop on an unhandled error (once; a loop of them is crash_looping);
    - stuck: alive, yet for KOALA_STUCK_AFTER_SECONDS it has held one attempt, or it had due
      work in its (unpaused) queues and neither started nor finished anything;
    - idle: alive with nothing due, or with due work only in paused queues (it says which, and
      how much waits there: ``due``, due jobs per queue, when the caller has counted them);
      healthy: alive and working; stopped: stopped cleanly.
    """
    alive_within = dt.timedelta(seconds=WorkerProcess.silent_after_seconds())
    stuck_after = dt.timedelta(seconds=float(settings.KOALA_STUCK_AFTER_SECONDS))
    window = dt.timedelta(seconds=float(settings.KOALA_CRASH_LOOP_WINDOW_SECONDS))
    processes = list(
        WorkerProcess.objects.filter(
            Q(stopped_at__isnull=True, last_seen_at__gte=now - DAY)
            | Q(started_at__gte=now - window)
            | Q(stopped_at__gte=now - window)
        ).order_by("hostname", "-started_at")[:200]
    )
    if not processes:
        return []
    names = [p.name for p in processes]

    abnormal: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for process in processes:
        # A fixed-name worker restarted by its service manager keeps one row with its exits.
        times = [dt.datetime.fromisoformat(e["at"]) for e in process.recent_exits if e.get("exit") in ABNORMAL_EXITS]
        if process.exit == WorkerExit.RUNNING and now - process.last_seen_at > alive_within:
            times.append(process.last_seen_at)  # silent, not restarted yet: a death nobody recorded
        abnormal[(process.hostname, tuple(process.queues))] += sum(1 for t in times if t >= now - window)

    # Each worker's live attempt (a process runs one at a time): one probe per worker.
    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_LIVE_ATTEMPTS, [names])
        live: dict[str, tuple[int, dt.datetime]] = {worker: (job_id, started) for worker, job_id, started in cursor.fetchall()}
    # The newest finished attempt of each worker: one index descent per worker.
    last_ids = RawSQL(sql.DASHBOARD_LAST_FINISHED_ATTEMPTS, [names, now - DAY])  # noqa: S611 (a workers.sql statement; values are bound)
    last_done = {
        a.worker_id: a
        for a in Attempt.objects.filter(id__in=last_ids)
        .select_related("job")
        .only("worker_id", "finished_at", "started_at", "outcome", "job__id", "job__kind")
    }
    # The newest settled operation of each worker: per worker, top 1 over its attempts' operations.
    op_ids = RawSQL(sql.DASHBOARD_LAST_SETTLED_OPERATIONS, [names, now - DAY])  # noqa: S611 (a workers.sql statement; values are bound)
    last_op = {
        op.attempt.worker_id: op  # type: ignore[union-attr]  # joined on the attempt: never None
        for op in Operation.objects.filter(id__in=op_ids)
        .select_related("attempt")
        .only("id", "name", "kind", "state", "settled_at", "job_id", "attempt__worker_id")
    }
    # Queues whose oldest due job has waited longer than stuck_after (one probe per queue).
    waiting = oldest_due(now=now)
    due_queues = {queue for queue, due_at in waiting.items() if due_at <= now - stuck_after}
    # Work held back by a pause is not a stuck worker's fault.
    held = queue_pauses(active_pauses() if pauses is None else pauses, waiting)
    due_queues -= set(held)

    result = []
    for process in processes:
        done = last_done.get(process.name)
        live_job_id, started_live = live.get(process.name, (None, None))
        last_activity = max([t for t in (process.started_at, done.finished_at if done else None, started_live) if t is not None])
        exits = abnormal.get((process.hostname, tuple(process.queues)), 0)
        if exits >= int(settings.KOALA_CRASH_LOOP_STARTS):
            status, why = (
                "crash_looping",
                f"{exits} abnormal exits on {process.hostname} within {window.total_seconds():.0f} s",
            )
        elif process.exit == WorkerExit.CRASHED:
            detail = process.recent_exits[-1].get("detail", "") if process.recent_exits else ""
            status, why = "crashed", f"exited on {detail or 'an error'} at {process.stopped_at or process.last_seen_at:%H:%M:%S}"
        elif process.stopped_at is not None:
            status, why = "stopped", f"stopped at {process.stopped_at:%H:%M:%S}"
        elif now - process.last_seen_at > alive_within:
            status, why = "lost", f"no sign of life for {(now - process.last_seen_at).total_seconds():.0f} s"
        elif started_live is not None and now - started_live > stuck_after:
            status, why = "stuck", f"one attempt running for {(now - started_live).total_seconds():.0f} s"
        elif started_live is None and due_queues & set(process.queues) and now - last_activity > stuck_after:
            status, why = (
                "stuck",
                f"due work waiting, nothing started or finished for {(now - last_activity).total_seconds():.0f} s",
            )
        elif started_live is not None:
            status, why = "healthy", "running a job"
        elif paused_here := [q for q in process.queues if q in held]:
            # Due work waits, but a pause holds it: idle by order, not for want of work.
            status, why = "idle", "; ".join(_held_back(queue, held[queue], due) for queue in paused_here)
        else:
            status, why = "idle", "alive, nothing due"
        result.append(
            WorkerHealth(
                name=process.name,
                hostname=process.hostname,
                queues=list(process.queues),
                status=status,
                why=why,
                started_at=process.started_at,
                last_seen_at=process.last_seen_at,
                live_job_id=live_job_id,
                last_completed=done,
                last_operation=last_op.get(process.name),
            )
        )
    return result


def _held_back(queue: str, pause: Pause, due: dict[str, int] | None) -> str:
    count = f"{due[queue]:,} due" if due and queue in due else "due work"
    if pause.scope == Scope.GLOBAL:
        return f"everything paused ({pause.mode}): {count} waiting in {queue}"
    return f"queue {queue} paused ({pause.mode}): {count} waiting"


def _local_day(budget: Budget, now: dt.datetime) -> dt.date:
    try:
        zone = ZoneInfo(budget.timezone)
    except (KeyError, ValueError):
        zone = ZoneInfo("UTC")
    return now.astimezone(zone).date()


def budget_bars(*, now: dt.datetime, only: Budget | None = None) -> list[BudgetBar]:
    """Today's usage of every budget (its own time zone's day) against its limits: two queries."""
    budgets = [only] if only is not None else list(Budget.objects.all()[:100])
    if not budgets:
        return []
    periods = {b.pk: _local_day(b, now) for b in budgets}
    wanted = Q()
    for budget_id, period in periods.items():
        wanted |= Q(budget_id=budget_id, period=period)
    usage = {u.budget_id: u for u in BudgetUsage.objects.filter(wanted)}
    bars = []
    for budget in budgets:
        used = usage.get(budget.pk)
        rows: list[tuple[str, int | float, int | None]] = [
            ("spend", (used.spent_minor + used.reserved_minor) if used else 0, budget.spend_limit_minor),
            ("requests", used.requests if used else 0, budget.request_limit),
            ("attempts", used.attempts if used else 0, budget.attempt_limit),
            ("run seconds", round(used.run_seconds, 1) if used else 0, budget.run_seconds_limit),
        ]
        bars.append(BudgetBar(budget=budget, period=periods[budget.pk], usage=used, rows=rows))
    return bars


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
    )
