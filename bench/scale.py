"""Scale benchmark: the engine's and the console's queries on a big job table.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.scale [--jobs 1000000] [--reps 300] [--page-reps 200] [--before-reps 30] [--reseed]

Not a test: it prints machine information and markdown tables (bench/README.md, "Scale
benchmark", explains them). It seeds ``--jobs`` jobs (20% queued, 2% running, 0.2% parked on
a budget, the rest finished; attempts rows for every job that ran) into the database in
DATABASE_URL with INSERT … SELECT generate_series, VACUUM ANALYZEs, then times, each as p50 /
p95 over many repetitions:

- the engine's statements through Koala's own services: claim (``leases.claim_next``),
  complete (``transitions.end_attempt``), dispatch (``maintenance.dispatch``), reaper
  (``maintenance.reap``), unpark (``budgets.unpark_ready``);
- the console's pages through Django's test Client as a logged-in superuser: the dashboard,
  the job list under several filters, and search by id, trace id, correlation id and
  idempotency key;
- before/after, where a statement or an index changed (migration 0009): the old statement
  text, or the old index set rebuilt inside a transaction that is rolled back.

The seed is reused while the table holds exactly ``--jobs`` jobs (``--reseed`` forces it).
It refuses a database whose name lacks "bench" and Redis db 0 unless --force: it TRUNCATEs
Koala's tables and FLUSHDBs the Redis db.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above

# (kind, queue, share of jobs in %): a skewed, realistic spread; the kinds are the built-in ones.
KINDS = [
    ("email.send", "default", 30),
    ("model.complete", "default", 15),
    ("incr", "bulk", 15),
    ("shop.order_and_charge", "critical", 12),
    ("noop", "default", 10),
    ("django.task", "default", 8),
    ("sleep", "bulk", 5),
    ("export.csv", "exports", 3),
    ("demo.flaky", "default", 2),
]
WORKERS = 20
USER = "bench-scale"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the seeded table (default 1,000,000)")
    parser.add_argument("--reps", type=int, default=300, help="repetitions per engine statement")
    parser.add_argument("--page-reps", type=int, default=200, help="repetitions per console page")
    parser.add_argument("--dashboard-reps", type=int, default=20, help="repetitions of the dashboard (seconds each at 1M)")
    parser.add_argument("--before-reps", type=int, default=30, help="repetitions per 'before' measurement (0: skip them)")
    parser.add_argument("--reseed", action="store_true", help="seed again even if the table holds --jobs jobs")
    parser.add_argument("--only-dashboard", action="store_true", help="time the dashboard page alone")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if args.jobs < 1000 or args.reps < 1 or args.page_reps < 1 or args.before_reps < 0:
        parser.error("--jobs must be at least 1000 and the repetitions positive")
    return args


# -- seeding ------------------------------------------------------------------------------------

_SEED_JOBS_SQL = """
INSERT INTO workers_job (kind, version, queue, input, input_fingerprint, idempotency_key, state, priority, delivery,
    scheduled_at, attempts, max_attempts, timeout_seconds, lease_token, lease_holder, lease_expires_at, heartbeat_at,
    progress, run_state, result, usage, failure_reason, error_class, error_message, park_reason, park_detail, parked_on,
    parked_at, correlation_id, trace_id, created_by, created_at, updated_at, finished_at)
SELECT k.kind, 1, k.queue, jsonb_build_object('n', g.i), md5(g.i::text),
       CASE WHEN g.i %% 2 = 0 THEN 'bench-' || g.i END,
       s.state, CASE WHEN abs(hashint4(g.i + 3)) %% 40 = 0 THEN 5 ELSE 0 END, 'at_least_once',
       -- a tenth of the queued jobs wait for a delay or a backoff (due within the hour)
       CASE WHEN s.state = 'queued' AND g.i %% 10 = 3 THEN now() + make_interval(secs => 60 + g.i %% 3600)
            ELSE c.created_at END,
       a.attempts, 3, 30, a.attempts,
       CASE WHEN s.state = 'running' THEN 'bench-worker-' || (g.i %% %(workers)s) END,
       -- running leases are long, so no lease expires while the bench runs (the reaper's steady state)
       CASE WHEN s.state = 'running' THEN now() + interval '1 day' END,
       CASE WHEN s.state = 'running' THEN now() END,
       '{}', '{}', CASE WHEN s.state = 'succeeded' THEN '{"ok": true}'::jsonb END, '{}',
       CASE WHEN s.state = 'failed' THEN (ARRAY['fatal', 'fatal', 'fatal', 'attempts_exhausted', 'attempts_exhausted',
            'terminal', 'terminal', 'orphaned', 'fatal', 'deadline_exceeded'])[1 + g.i %% 10] END,
       CASE WHEN s.state = 'failed' THEN 'BenchError' ELSE '' END,
       CASE WHEN s.state = 'failed' THEN 'failed in the bench seed' ELSE '' END,
       CASE WHEN s.state = 'parked' THEN 'budget' END,
       CASE WHEN s.state = 'parked' THEN 'bench budget exhausted' ELSE '' END,
       CASE WHEN s.state = 'parked' THEN %(parked_on)s::jsonb ELSE '{}'::jsonb END,
       CASE WHEN s.state = 'parked' THEN c.created_at + interval '1 s' END,
       -- most correlation ids default to the trace id (as enqueue does); some group ten jobs
       CASE WHEN g.i %% 10 < 7 THEN md5(g.i::text) ELSE 'corr-' || (g.i / 10) END,
       md5(g.i::text), 'bench', c.created_at, c.created_at,
       CASE WHEN s.state IN ('succeeded', 'failed', 'cancelled')
            THEN LEAST(now(), c.created_at + make_interval(secs => 1 + g.i %% 30)) END
FROM generate_series(1, %(n)s) AS g(i)
CROSS JOIN LATERAL (SELECT 1 + abs(hashint4(g.i + 7777777)) %% 100 AS slot) AS r
CROSS JOIN LATERAL (SELECT (%(kinds)s::text[])[r.slot] AS kind, (%(queues)s::text[])[r.slot] AS queue) AS k
CROSS JOIN LATERAL (
    -- The newest quarter of the ids was created in the last six hours, a backlog building up:
    -- 80%% of those are still queued, 8%% running, 0.8%% parked on the budget, the rest finished.
    -- Everything older finished, spread over 30 days (so a 24 h window holds about 5%% of them).
    SELECT CASE WHEN g.i > %(n)s - %(window)s AND g.i %% 250 < 200 THEN 'queued'
                WHEN g.i > %(n)s - %(window)s AND g.i %% 250 < 220 THEN 'running'
                WHEN g.i > %(n)s - %(window)s AND g.i %% 250 < 222 THEN 'parked'
                WHEN abs(hashint4(g.i)) %% 100 < 90 THEN 'succeeded'
                WHEN abs(hashint4(g.i)) %% 100 < 97 THEN 'failed'
                ELSE 'cancelled' END AS state,
           CASE WHEN g.i > %(n)s - %(window)s
                THEN now() - interval '6 hours' + (g.i - (%(n)s - %(window)s)) * (interval '6 hours' / %(window)s)
                ELSE now() - interval '30 days' + g.i * ((interval '30 days' - interval '6 hours') / (%(n)s - %(window)s))
           END AS created_at
) AS s
CROSS JOIN LATERAL (SELECT s.created_at) AS c
CROSS JOIN LATERAL (
    SELECT CASE WHEN s.state IN ('queued', 'parked', 'cancelled') THEN 0
                WHEN s.state <> 'running' AND g.i %% 10 = 0 THEN 2 ELSE 1 END AS attempts
) AS a
"""

# One attempt row per attempt used; earlier ones were retries, the last one holds the job's
# lease token and outcome (live, with no outcome, for a running job).
_SEED_ATTEMPTS_SQL = """
INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, heartbeat_at, finished_at, outcome,
    error_class, error_message, compute_seconds, db_wait_seconds, storage_wait_seconds, usage)
SELECT j.id, n.number, 'bench-worker-' || (j.id %% %(workers)s), n.number, t.started_at, t.started_at,
       CASE WHEN n.number < j.attempts THEN t.started_at + interval '0.4 s'
            WHEN j.state = 'running' THEN NULL
            ELSE GREATEST(j.finished_at, t.started_at + interval '0.1 s') END,
       CASE WHEN n.number < j.attempts THEN 'retry'
            WHEN j.state = 'running' THEN NULL
            ELSE j.state END,
       CASE WHEN n.number < j.attempts OR j.state = 'failed' THEN 'BenchError' ELSE '' END,
       '', 0.01, 0.002, 0, '{}'
FROM workers_job j
CROSS JOIN LATERAL generate_series(1, j.attempts) AS n(number)
CROSS JOIN LATERAL (
    SELECT CASE WHEN j.state = 'running' THEN now() - make_interval(secs => j.id %% 20)
                ELSE j.created_at + (n.number - 1) * interval '0.5 s' END AS started_at
) AS t
WHERE j.attempts > 0
"""


def _kind_slots() -> tuple[list[str], list[str]]:
    kinds: list[str] = []
    queues: list[str] = []
    for kind, queue, share in KINDS:
        kinds += [kind] * share
        queues += [queue] * share
    assert len(kinds) == 100
    return kinds, queues


def seeded_jobs() -> int:
    from workers.models import Job

    return Job.objects.filter(created_by="bench").count() if Job.objects.exists() else 0


def seed(n: int) -> float:
    """Fill the tables; indexes are dropped first and rebuilt after (much faster than
    maintaining ten indexes row by row), then everything is VACUUM ANALYZEd."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from workers.models import Budget, WorkerProcess
    from workers.services.budgets import period_for

    started = time.perf_counter()
    kinds, queues = _kind_slots()
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE workers_job, workers_attempt, workers_operation, workers_pause, workers_budget, "
            "workers_budgetusage, workers_workerprocess RESTART IDENTITY CASCADE"
        )
        cursor.execute("SET maintenance_work_mem = '256MB'")
    budget = Budget.objects.create(name="bench-spend", scope="global", spend_limit_minor=0, created_by="bench")
    parked_on = {"budget_id": budget.pk, "limit": "spend", "need": 100, "period": period_for(budget).isoformat()}
    import json

    with transaction.atomic(), connection.cursor() as cursor:
        # The FKs are deferrable: check them per statement, or CREATE INDEX refuses to run
        # with the attempts' pending trigger events.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid IN ('workers_job'::regclass, 'workers_attempt'::regclass) "
            "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid)"
        )
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        params = {
            "n": n,
            "window": n // 4,
            "workers": WORKERS,
            "kinds": kinds,
            "queues": queues,
            "parked_on": json.dumps(parked_on),
        }
        cursor.execute(_SEED_JOBS_SQL, params)
        cursor.execute(_SEED_ATTEMPTS_SQL, params)
        for _, definition in indexes:
            cursor.execute(definition)
    now = timezone.now()
    served = sorted({f"{kind}@1" for kind, _, _ in KINDS})
    WorkerProcess.objects.bulk_create(
        WorkerProcess(
            name=f"bench-worker-{w}",
            hostname="bench-host",
            pid=10_000 + w,
            queues=sorted({q for _, q, _ in KINDS}),
            kinds=served,
            worker_class="simple",
            started_at=now,
            last_seen_at=now,
        )
        for w in range(WORKERS)
    )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE workers_job")
        cursor.execute("VACUUM ANALYZE workers_attempt")
    user_model = get_user_model()
    if not user_model.objects.filter(username=USER).exists():
        user_model.objects.create_superuser(USER, "bench@example.invalid", None)
    return time.perf_counter() - started


# -- measuring ----------------------------------------------------------------------------------


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p95 in milliseconds."""
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered) * 1000, p95 * 1000


def timed(fn: Callable[[], Any], reps: int, *, warmup: int = 3) -> tuple[float, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return percentiles(samples)


# The dispatcher's statement before migration 0009's change (workers/services/maintenance.py).
OLD_DISPATCH_SQL = (
    """
SELECT q.queue, d.id, d.version
FROM (SELECT DISTINCT queue FROM workers_job WHERE state = 'queued' AND scheduled_at <= now()) q
CROSS JOIN LATERAL (
    SELECT id, version FROM workers_job
    WHERE state = 'queued' AND queue = q.queue AND scheduled_at <= now() AND NOT EXISTS (SELECT 1 FROM workers_pause p WHERE """
    + "p.lifted_at IS NULL AND (p.expires_at IS NULL OR p.expires_at > now()) AND (p.scope = 'global' OR "
    "(p.scope = 'queue' AND p.target = workers_job.queue) OR (p.scope = 'kind' AND p.target = workers_job.kind)))"
    + """
    ORDER BY priority DESC, scheduled_at, id LIMIT %s
) d
"""
)

# The job indexes before migration 0009, and the ones it added (rebuilt / dropped inside a
# rolled-back transaction for the "before" rows).
OLD_INDEXES = [
    "CREATE INDEX job_state_created_idx ON workers_job (state, created_at DESC)",
    "CREATE INDEX job_kind_state_created_idx ON workers_job (kind, state, created_at DESC)",
    "CREATE INDEX job_queue_state_created_idx ON workers_job (queue, state, created_at DESC)",
]
NEW_INDEXES = [
    "job_list_idx",
    "job_state_list_idx",
    "job_kind_state_list_idx",
    "job_queue_state_list_idx",
    "job_failed_list_idx",
    "job_trace_idx",
    "job_correlation_idx",
    "job_idempotency_key_idx",
    "job_queued_deadline_idx",
]


def old_filtered_jobs(filters: Any) -> Any:
    """console.selectors.jobs.filtered_jobs before 0009: ORDER BY -id, the reason as an OR."""
    from django.db.models import Q

    from console.selectors.jobs import LIST_FIELDS
    from workers.models import Job

    jobs = Job.objects.only(*LIST_FIELDS).order_by("-id")
    if filters.state:
        jobs = jobs.filter(state=filters.state)
    if filters.kind:
        jobs = jobs.filter(kind=filters.kind)
    if filters.queue:
        jobs = jobs.filter(queue=filters.queue)
    if filters.reason:
        jobs = jobs.filter(Q(failure_reason=filters.reason) | Q(park_reason=filters.reason))
    if filters.created_after:
        jobs = jobs.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        jobs = jobs.filter(created_at__lt=filters.created_before)
    if filters.search:
        term = filters.search.strip()
        match = Q(idempotency_key=term) | Q(trace_id=term) | Q(correlation_id=term)
        if term.isdigit():
            match |= Q(pk=int(term))
        jobs = jobs.filter(match)
    return jobs


@contextmanager
def old_schema() -> Iterator[None]:
    """The console's code and indexes as they were before 0009, inside a transaction that is
    rolled back (DDL is transactional in PostgreSQL; the scratch table is locked meanwhile)."""
    from unittest import mock

    from django.core.paginator import Paginator
    from django.db import connection, transaction

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
            for name in NEW_INDEXES:
                cursor.execute(f"DROP INDEX {name}")
            for statement in OLD_INDEXES:
                cursor.execute(statement)
            cursor.execute("ANALYZE workers_job")
            with (
                mock.patch("console.views.jobs.filtered_jobs", old_filtered_jobs),
                mock.patch("console.views.jobs.ListPaginator", Paginator),
            ):
                yield
            raise Rollback
    except Rollback:
        pass


def pages(sample: dict[str, Any]) -> list[tuple[str, str]]:
    from urllib.parse import urlencode

    def jobs(**query: Any) -> str:
        return "/admin/console/jobs/" + (("?" + urlencode(query)) if query else "")

    day = sample["created_at"]
    return [
        ("dashboard", "/admin/console/"),
        ("job list, no filter", jobs()),
        ("job list, state=queued", jobs(state="queued")),
        ("job list, state=succeeded", jobs(state="succeeded")),
        ("job list, kind+state", jobs(kind="email.send", state="succeeded")),
        ("job list, queue+state", jobs(queue="bulk", state="queued")),
        ("job list, kind+queue+state", jobs(kind="shop.order_and_charge", queue="critical", state="failed")),
        ("job list, reason=fatal", jobs(cause="fatal")),
        ("job list, reason=budget (parked)", jobs(cause="budget")),
        ("job list, created in a 1 h range", jobs(created_after=f"{day:%Y-%m-%dT%H:%M}", created_before=f"{day:%Y-%m-%dT}23:59")),
        ("job list, page 150 (offset 7,450)", jobs(page=150)),
        ("search by job id", jobs(search=str(sample["id"]))),
        ("search by trace id", jobs(search=sample["trace_id"])),
        ("search by correlation id", jobs(search=sample["correlation_id"])),
        ("search by idempotency key", jobs(search=sample["idempotency_key"])),
    ]


def machine() -> list[str]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (version,) = cursor.fetchone()
        cursor.execute("SHOW shared_buffers")
        (buffers,) = cursor.fetchone()
        cursor.execute("SELECT state, count(*) FROM workers_job GROUP BY state ORDER BY state")
        states = ", ".join(f"{s} {n:,}" for s, n in cursor.fetchall())
        cursor.execute("SELECT count(*) FROM workers_attempt")
        (attempts,) = cursor.fetchone()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return [
        f"- nproc: {os.cpu_count()}, {platform.platform()}, load average {load:.2f} at the start",
        f"- {version.split(' on ')[0]}, shared_buffers={buffers}; Python {platform.python_version()}",
        f"- jobs: {states}; attempts: {attempts:,}",
    ]


def main() -> None:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="seed and TRUNCATE", redis_action="FLUSHDB")
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from redis import Redis

    from console.selectors.jobs import COUNT_CAP
    from workers import outcomes, sql, transitions
    from workers.models import Job
    from workers.services import budgets, leases, maintenance

    call_command("migrate", interactive=False, verbosity=0)
    Redis.from_url(os.environ["REDIS_URL"]).flushdb()
    if args.reseed or seeded_jobs() != args.jobs:
        print(f"seeding {args.jobs:,} jobs …", file=sys.stderr, flush=True)
        print(f"seeded in {seed(args.jobs):.0f} s", file=sys.stderr, flush=True)
    print(f"# Scale benchmark, {args.jobs:,} jobs\n")
    print("\n".join(machine()))
    print(
        f"- repetitions: {args.reps} per engine statement, {args.page_reps} per page ({args.dashboard_reps} for the"
        f" dashboard), {args.before_reps} per 'before' row\n"
    )

    rows: list[tuple[str, str, tuple[float, float], tuple[float, float] | None]] = []
    served = sorted({f"{kind}@1" for kind, _, _ in KINDS})
    queues = sorted({queue for _, queue, _ in KINDS})

    # claim and complete alternate: each claim takes the head of a queue, each completion ends
    # that lease, so the queued/running counts stay as seeded (less --reps jobs).
    claim_samples: list[float] = []
    complete_samples: list[float] = []
    for rep in range(0 if args.only_dashboard else args.reps + 3):
        queue = queues[rep % len(queues)]
        started = time.perf_counter()
        lease = leases.claim_next(queue=queue, served=served, worker="bench-claimer", lease_seconds=60, gated=False)
        claimed = time.perf_counter()
        assert lease is not None, f"nothing to claim in {queue}"
        rejection = transitions.end_attempt(outcomes.Complete(result={"ok": True}, state_delta={}), lease)
        done = time.perf_counter()
        assert rejection is None, rejection
        if rep >= 3:
            claim_samples.append(claimed - started)
            complete_samples.append(done - claimed)
    if not args.only_dashboard:
        rows.append(("engine", "claim (leases.claim_next)", percentiles(claim_samples), None))
        rows.append(("engine", "complete (transitions.end_attempt)", percentiles(complete_samples), None))

    def dispatch_statement(sql: str) -> Callable[[], None]:
        def run() -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql, [4])
                cursor.fetchall()

        return run

    if not args.only_dashboard:
        before = timed(dispatch_statement(OLD_DISPATCH_SQL), args.before_reps) if args.before_reps else None
        rows.append(("engine", "dispatch statement", timed(dispatch_statement(sql.DISPATCH_DUE), args.reps), before))
        rows.append(
            ("engine", "dispatch (maintenance.dispatch, with the Redis ring)", timed(maintenance.dispatch, args.reps), None)
        )
        rows.append(("engine", "reaper (maintenance.reap, nothing expired)", timed(maintenance.reap, args.reps), None))
        rows.append(
            ("engine", "unpark (budgets.unpark_ready, 2,000 parked, no room)", timed(budgets.unpark_ready, args.reps), None)
        )

    sample_row = (
        Job.objects.filter(state="succeeded", idempotency_key__isnull=False, correlation_id__startswith="corr-")
        .order_by("-id")
        .values("id", "trace_id", "correlation_id", "idempotency_key", "created_at")
        .first()
    )
    assert sample_row is not None
    from django.conf import settings

    # The test Client talks to "testserver"; the bench serves no real HTTP.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = Client()
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username=USER))

    def get(url: str) -> Callable[[], None]:
        def run() -> None:
            response = client.get(url)
            assert response.status_code == 200, (url, response.status_code)

        return run

    page_list = pages(sample_row)
    if args.only_dashboard:
        page_list = [(name, url) for name, url in page_list if name == "dashboard"]
    befores: dict[str, tuple[float, float]] = {}
    if args.before_reps and not args.only_dashboard:
        print("timing the pages on the pre-0009 indexes (rebuilt in a transaction) …", file=sys.stderr, flush=True)
        with old_schema():
            for name, url in page_list:
                reps = min(args.before_reps, args.dashboard_reps) if name == "dashboard" else args.before_reps
                befores[name] = timed(get(url), reps, warmup=1)
    for name, url in page_list:
        reps = args.dashboard_reps if name == "dashboard" else args.page_reps
        rows.append(("console", name, timed(get(url), reps, warmup=1), befores.get(name)))

    print("| part | what | p50 ms | p95 ms | before p50 ms | before p95 ms | p95 before / after |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for part, name, (p50, p95), old in rows:
        if old:
            tail = f"{old[0]:.1f} | {old[1]:.1f} | {old[1] / p95:.1f}x"
        else:
            tail = "- | - | -"
        print(f"| {part} | {name} | {p50:.2f} | {p95:.2f} | {tail} |")
    engine_p95 = max((p95 for part, name, (_, p95), _ in rows if part == "engine" and "Redis" not in name), default=0.0)
    page_p95 = max(p95 for part, _, (_, p95), _ in rows if part == "console")
    print(f"\nTargets: engine statements <= 2 ms p95 (worst {engine_p95:.2f}), pages <= 150 ms p95 (worst {page_p95:.1f}).")
    print(f"The job list counts at most {COUNT_CAP:,} matches (then says 'more than').")


if __name__ == "__main__":
    main()
