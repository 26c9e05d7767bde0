"""A snapshot as Prometheus metric families, and the text a scrape answers. Pure: no database.

Names follow Prometheus' conventions (``koala_…``, base units, ``_seconds``, ``_total``) and are
a contract (docs/metrics.md): alert rules and the Grafana dashboard query them by name. Labels
are bounded (queue, kind, outcome, reason, state, part, budget, resource, currency, schedule,
scope): names an operator configured or the engine's closed sets, never ids, keys or free text.
A value that does not look like a name becomes ``other``, so a bug can never put data in a label.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from metrics.selectors import Snapshot
from metrics.services import BUCKETS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

JOB_STATES = ("queued", "running", "parked", "succeeded", "failed", "cancelled")
PARK_REASONS = ("waiting_review", "needs_attention", "budget")
# koala_workers' states: every one present (0 allowed), so an alert on one never sees "no data".
WORKER_STATES = ("healthy", "idle", "stuck", "crash_looping", "lost", "crashed", "stopped")
DURATION_PARTS = ("total", "compute", "database_wait", "storage_wait")

# A label value: a queue, kind, budget or schedule name as configured (letters, digits, . _ - : @ /),
# at most 100 characters; anything else (spaces, quotes, a newline, a secret-looking blob) is "other".
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,99}$")


def bounded(value: str) -> str:
    """A label value that is a name, else ``other``. The empty string stays empty (currency "")."""
    if value == "":
        return ""
    return value if _LABEL.match(value) else "other"


def _ts(value: dt.datetime | None) -> float:
    return 0.0 if value is None else value.timestamp()


def _age(now: dt.datetime, then: dt.datetime | None) -> float:
    return 0.0 if then is None else max((now - then).total_seconds(), 0.0)


def _sum_into(target: dict[tuple[str, ...], float], key: tuple[str, ...], value: float) -> None:
    # Two raw values may bound to one label value ("other"): their counts add up, never clash.
    target[key] = target.get(key, 0.0) + value


def families(snap: Snapshot, *, scrape_seconds: float | None = None, up: bool = True) -> list[Metric]:
    """Every family of the contract (docs/metrics.md) for ``snap``. With ``up`` False (the
    database did not answer) only koala_up and koala_scrape_duration_seconds."""
    out: list[Metric] = []
    if up:
        out.extend(_engine(snap))
    scrape = GaugeMetricFamily("koala_scrape_duration_seconds", "Seconds this scrape took to build (this process).")
    scrape.add_metric([], scrape_seconds or 0.0)
    out.append(scrape)
    alive = GaugeMetricFamily("koala_up", "1 when the database answered this scrape.")
    alive.add_metric([], 1.0 if up else 0.0)
    out.append(alive)
    return out


def _engine(snap: Snapshot) -> Iterator[Metric]:
    queues = [q for q in snap.queues]
    now = snap.now

    jobs = GaugeMetricFamily("koala_jobs", "Jobs by queue and state (finished ones: rows still kept).", labels=["queue", "state"])
    counts: dict[tuple[str, ...], float] = {}
    for queue in queues:
        for state in JOB_STATES:
            _sum_into(counts, (bounded(queue), state), float(snap.jobs.get((queue, state), 0)))
    for key, value in sorted(counts.items()):
        jobs.add_metric(list(key), value)
    yield jobs

    due = GaugeMetricFamily("koala_jobs_due", "Queued jobs due now (scheduled_at <= now).", labels=["queue"])
    age = GaugeMetricFamily(
        "koala_queue_oldest_due_age_seconds",
        "Seconds the oldest due queued job has waited; 0 when none is due.",
        labels=["queue"],
    )
    due_by: dict[tuple[str, ...], float] = {}
    age_by: dict[tuple[str, ...], float] = {}
    for queue in queues:
        key = (bounded(queue),)
        _sum_into(due_by, key, float(snap.due.get(queue, 0)))
        age_by[key] = max(age_by.get(key, 0.0), _age(now, snap.oldest_due.get(queue)))
    for key, value in sorted(due_by.items()):
        due.add_metric(list(key), value)
    for key, value in sorted(age_by.items()):
        age.add_metric(list(key), value)
    yield due
    yield age

    parked = GaugeMetricFamily("koala_jobs_parked", "Parked jobs by queue and reason.", labels=["queue", "reason"])
    parked_by: dict[tuple[str, ...], float] = {}
    for queue in queues:
        for reason in PARK_REASONS:
            _sum_into(parked_by, (bounded(queue), reason), float(snap.parked.get((queue, reason), 0)))
    for key, value in sorted(parked_by.items()):
        parked.add_metric(list(key), value)
    yield parked

    yield _counter(
        "koala_job_completions",
        "Attempts that ended, by queue, kind and outcome (survives restarts and pruning).",
        ["queue", "kind", "outcome"],
        snap.completions.items(),
    )
    yield _counter(
        "koala_job_failures",
        "Jobs that ended failed, by queue, kind and failure reason (survives restarts and pruning).",
        ["queue", "kind", "reason"],
        snap.failures.items(),
    )

    hist = HistogramMetricFamily(
        "koala_attempt_duration_seconds",
        "Attempt durations by kind and part: total (start to end), compute, database_wait, storage_wait.",
        labels=["kind", "part"],
    )
    merged: dict[tuple[str, str], tuple[list[float], float]] = {}
    for (kind, part), (per_bucket, total) in snap.durations.items():
        key = (bounded(kind), part if part in DURATION_PARTS else "other")
        counts_so_far, sum_so_far = merged.get(key, ([0.0] * (len(BUCKETS) + 1), 0.0))
        merged[key] = ([a + float(b) for a, b in zip(counts_so_far, per_bucket, strict=True)], sum_so_far + total)
    for (kind, part), (bucket_counts, bucket_sum) in sorted(merged.items()):
        cumulative: list[tuple[str, float]] = []
        running = 0.0
        for bound, n in zip([*(_le(b) for b in BUCKETS), "+Inf"], bucket_counts, strict=True):
            running += n
            cumulative.append((bound, running))
        hist.add_metric([kind, part], buckets=cumulative, sum_value=bucket_sum)
    yield hist

    yield _counter(
        "koala_rejections",
        "Named refusals by reason: a stale lease or fence, a budget, a pause, an API call's bad input.",
        ["reason"],
        [((reason,), n) for reason, n in snap.rejections.items()],
    )

    yield _gauge("koala_orphaned_leases", "Running jobs whose lease has expired (the reaper's next work).", snap.orphaned_leases)

    used = GaugeMetricFamily(
        "koala_budget_used",
        "Today's usage of a budget (its own zone's day); spend in minor units.",
        labels=["budget", "resource", "currency"],
    )
    limit = GaugeMetricFamily(
        "koala_budget_limit", "A budget's limit, where it has one.", labels=["budget", "resource", "currency"]
    )
    ratio = GaugeMetricFamily(
        "koala_budget_used_ratio", "used / limit (1 or more: exhausted); absent without a limit.", labels=["budget", "resource"]
    )
    for line in snap.budgets:
        name = bounded(line.budget)
        currency = bounded(line.currency) if line.resource == "spend" else ""
        used.add_metric([name, line.resource, currency], line.used)
        if line.limit is not None:
            limit.add_metric([name, line.resource, currency], line.limit)
            ratio.add_metric(
                [name, line.resource], line.used / line.limit if line.limit > 0 else (0.0 if line.used == 0 else 1.0)
            )
    yield used
    yield limit
    yield ratio

    yield _gauge("koala_reviews_pending", "Reviews waiting for a decision.", snap.reviews_pending)
    yield _gauge(
        "koala_review_oldest_age_seconds",
        "Seconds the oldest pending review has waited; 0 when none.",
        _age(now, snap.review_oldest),
    )
    yield _gauge(
        "koala_operations_attention",
        "Operations needing a person: uncertain outcomes no lookup settled (jobs parked needs_attention).",
        snap.operations_attention,
    )

    workers = GaugeMetricFamily("koala_workers", "Worker processes by health state.", labels=["state"])
    for state in WORKER_STATES:
        workers.add_metric([state], float(snap.workers.get(state, 0)))
    yield workers

    yield _gauge(
        "koala_last_attempt_completed_timestamp_seconds",
        "Unix time of the newest finished attempt (0: none).",
        _ts(snap.last_attempt),
    )
    yield _gauge(
        "koala_last_operation_completed_timestamp_seconds",
        "Unix time of the newest settled operation (0: none).",
        _ts(snap.last_operation),
    )

    yield _counter(
        "koala_breaker_trips",
        "Circuit-breaker pauses written, by kind (pauses are never pruned).",
        ["kind"],
        [((kind,), n) for kind, n in snap.breaker_trips.items()],
    )
    tripped = GaugeMetricFamily("koala_breaker_tripped", "1 while a breaker pause of the kind is live.", labels=["kind"])
    tripped_by: dict[tuple[str, ...], float] = {}
    for kind, live in snap.breaker_tripped.items():
        key = (bounded(kind),)
        tripped_by[key] = max(tripped_by.get(key, 0.0), float(live))
    for key, value in sorted(tripped_by.items()):
        tripped.add_metric(list(key), value)
    yield tripped

    pauses = GaugeMetricFamily("koala_pauses", "Live pauses by scope.", labels=["scope"])
    for scope in ("global", "queue", "kind"):
        pauses.add_metric([scope], float(snap.pauses.get(scope, 0)))
    yield pauses

    yield _gauge(
        "koala_beat_last_tick_timestamp_seconds",
        "Unix time of the beat's newest finished step (0: never ticked).",
        _ts(snap.beat_last_tick),
    )
    last = GaugeMetricFamily(
        "koala_schedule_last_slot_timestamp_seconds", "Unix time of a schedule's last slot (0: none).", labels=["schedule"]
    )
    nxt = GaugeMetricFamily(
        "koala_schedule_next_slot_timestamp_seconds", "Unix time of a schedule's next slot (0: none).", labels=["schedule"]
    )
    for name in sorted(snap.schedule_last):
        last.add_metric([bounded(name)], _ts(snap.schedule_last[name]))
        nxt.add_metric([bounded(name)], _ts(snap.schedule_next.get(name)))
    yield last
    yield nxt

    yield _gauge(
        "koala_metrics_fold_lag_seconds",
        "Seconds since the fold mark (what the tallies hold; the scrape adds the rest); 0 before the first fold.",
        _age(now, snap.folded_before),
    )


def _le(bound: float) -> str:
    return repr(float(bound))


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], float(value))
    return family


def _counter(
    name: str, documentation: str, labels: list[str], rows: Iterable[tuple[tuple[str, ...], float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    merged: dict[tuple[str, ...], float] = {}
    for key, value in rows:
        _sum_into(merged, tuple(bounded(part) for part in key), float(value))
    for key, value in sorted(merged.items()):
        family.add_metric(list(key), value)
    return family


class _Fixed(Collector):
    """A collector over families already built (one snapshot, one registry per scrape)."""

    def __init__(self, built: list[Metric]) -> None:
        self.built = built

    def collect(self) -> Iterator[Metric]:
        yield from self.built


def render(built: list[Metric]) -> bytes:
    """The text exposition format (0.0.4) of ``built``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(built))
    return generate_latest(registry)
