"""The hot and per-page queries are served by the index meant for them (issue 9, scenario 7).

No timing: the real services' statements are captured as they run (or taken from the real
queryset) on a modestly seeded table, ANALYZEd, and EXPLAINed (FORMAT JSON) with the planner's
default settings (no enable_seqscan=off). The assertions are on plan node names, so dropping
or changing an index, or writing a query the index no longer matches, fails here long before
a table grows large enough for anyone to notice the latency (bench/scale.py measures that).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from console.selectors.jobs import JobFilter, filtered_jobs
from workers import outcomes
from workers import sql as engine_sql
from workers.services import budgets, leases, maintenance
from workers.services.jobs import JobSpec, enqueue_many
from workers.transitions import Ending, end_attempts

# services: plans are the planner's, and the embedded PostgreSQL (pgserver's 16) is not the machine's.
pytestmark = [pytest.mark.services, pytest.mark.django_db]

JOBS = 20_000
KINDS = ["email.send", "model.complete", "incr", "shop.order_and_charge", "noop", "export.csv"]
QUEUES = ["default", "default", "bulk", "critical", "default", "exports"]
LIST_INDEXES = {
    "job_list_idx",
    "job_state_list_idx",
    "job_kind_state_list_idx",
    "job_queue_state_list_idx",
    "job_failed_list_idx",
}


@pytest.fixture
def seeded() -> None:
    """20k jobs: the newest third queued or running across four queues, the rest finished;
    every job has a trace and correlation id, half an idempotency key; a few budget-parked."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO workers_job (kind, version, queue, input, input_fingerprint, idempotency_key, state, priority,
                delivery, scheduled_at, attempts, max_attempts, timeout_seconds, lease_token, lease_holder,
                lease_expires_at, progress, run_state, usage, failure_reason, error_class, error_message, park_reason,
                park_detail, parked_on, parked_at, correlation_id, trace_id, created_by, created_at, updated_at, finished_at)
            SELECT (%(kinds)s::text[])[1 + i %% 6], 1, (%(queues)s::text[])[1 + i %% 6], '{}', md5(i::text),
                   CASE WHEN i %% 2 = 0 THEN 'key-' || i END, s.state, 0, 'at_least_once',
                   now() - make_interval(secs => %(n)s - i), CASE WHEN s.state IN ('queued', 'parked') THEN 0 ELSE 1 END,
                   3, 30, 1, CASE WHEN s.state = 'running' THEN 'w' END,
                   CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END, '{}', '{}', '{}',
                   CASE WHEN s.state = 'failed' THEN (ARRAY['fatal', 'terminal', 'attempts_exhausted'])[1 + i %% 3] END,
                   '', '', CASE WHEN s.state = 'parked' THEN 'budget' END, '', '{}',
                   CASE WHEN s.state = 'parked' THEN now() END,
                   CASE WHEN i %% 10 < 7 THEN md5(i::text) ELSE 'corr-' || (i / 10) END, md5(i::text), 'test',
                   now() - make_interval(secs => %(n)s - i), now(),
                   CASE WHEN s.state IN ('succeeded', 'failed') THEN now() - make_interval(secs => %(n)s - i) END
            FROM generate_series(1, %(n)s) AS i,
                 LATERAL (SELECT CASE WHEN i > %(n)s * 2 / 3 AND i %% 10 < 8 THEN 'queued'
                                      WHEN i > %(n)s * 2 / 3 AND i %% 10 = 8 THEN 'running'
                                      WHEN i > %(n)s * 2 / 3 AND i %% 50 = 9 THEN 'parked'
                                      WHEN i %% 20 = 0 THEN 'failed' ELSE 'succeeded' END AS state) AS s
            """,
            {"n": JOBS, "kinds": KINDS, "queues": QUEUES},
        )
        cursor.execute(
            "INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, finished_at, outcome, "
            "error_class, error_message, usage) SELECT id, 1, 'w', 1, created_at, finished_at, "
            "CASE WHEN state = 'running' THEN NULL ELSE state END, '', '', '{}' FROM workers_job WHERE attempts > 0"
        )
        cursor.execute("ANALYZE workers_job")
        cursor.execute("ANALYZE workers_attempt")


def plan(sql: str, params: Any = None) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (raw,) = cursor.fetchone()
    document = json.loads(raw) if isinstance(raw, str) else raw
    return document[0]["Plan"]


def nodes(root: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield root
    for child in root.get("Plans", []):
        yield from nodes(child)


def job_scans(root: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, index name) of every node reading workers_job or one of its indexes."""
    return [
        (node["Node Type"], node.get("Index Name", ""))
        for node in nodes(root)
        if "Scan" in node["Node Type"]
        and (node.get("Relation Name") == "workers_job" or str(node.get("Index Name", "")).startswith(("job_", "workers_job")))
    ]


@contextmanager
def captured() -> Iterator[list[tuple[str, Any]]]:
    """The statements a real service runs, with their parameters."""
    statements: list[tuple[str, Any]] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield statements


def test_dispatcher_walks_the_queues_on_the_claim_index_instead_of_every_queued_row(seeded: None) -> None:
    with captured() as statements:
        maintenance.dispatch()
    (sql, params) = next((s, p) for s, p in statements if "workers_job" in s)
    root = plan(sql, params)
    types = [n["Node Type"] for n in nodes(root)]
    scans = job_scans(root)
    # The loose index scan: one descent of job_claim_idx per queue, never a pass over all of it.
    assert "Recursive Union" in types, types
    assert not {"Unique", "Aggregate", "Sort", "Gather", "Gather Merge"} & set(types), types
    assert scans and all(index == "job_claim_idx" and kind.startswith("Index") for kind, index in scans), scans


LIST_FILTERS = [
    JobFilter(),
    JobFilter(state="queued"),
    JobFilter(state="failed"),
    JobFilter(kind="shop.order_and_charge", state="succeeded"),
    JobFilter(queue="bulk", state="queued"),
    JobFilter(kind="email.send", queue="default", state="queued"),
    JobFilter(reason="terminal"),
]


def test_a_job_list_page_is_an_ordered_read_of_a_list_index(seeded: None) -> None:
    for filters in LIST_FILTERS:
        sql, params = filtered_jobs(filters)[:50].query.sql_with_params()
        root = plan(sql, params)
        types = [n["Node Type"] for n in nodes(root)]
        scans = job_scans(root)
        # The index hands rows over in the list's ORDER BY: no sort, no scan of the table.
        assert "Sort" not in types and "Incremental Sort" not in types, (filters, types)
        assert len(scans) == 1 and scans[0][0] in ("Index Scan", "Index Only Scan"), (filters, scans)
        assert scans[0][1] in LIST_INDEXES, (filters, scans)


def test_the_job_lists_count_is_bounded_and_index_only(seeded: None) -> None:
    from console.selectors.jobs import COUNT_CAP

    sql, params = filtered_jobs(JobFilter(state="succeeded")).order_by()[: COUNT_CAP + 1].query.sql_with_params()
    root = plan(f"SELECT count(*) FROM ({sql}) t", params)
    # Whatever reads the rows stops after COUNT_CAP + 1 of them.
    assert root["Node Type"] == "Aggregate" and root["Plans"][0]["Node Type"] == "Limit", root


def test_search_is_an_exact_match_on_one_btree_per_column(seeded: None) -> None:
    for field in ("trace_id", "correlation_id", "idempotency_key", "id"):
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {field} FROM workers_job WHERE idempotency_key IS NOT NULL ORDER BY id DESC LIMIT 1")
            (term,) = cursor.fetchone()
        sql, params = filtered_jobs(JobFilter(search=str(term)))[:50].query.sql_with_params()
        scans = job_scans(plan(sql, params))
        indexes = {index for kind, index in scans if kind == "Bitmap Index Scan"}
        expected = {"job_trace_idx", "job_correlation_idx", "job_idempotency_key_idx"}
        if field == "id":
            expected.add("workers_job_pkey")
        assert indexes == expected, (field, scans)
        assert all(kind != "Seq Scan" for kind, _ in scans), (field, scans)


def test_the_beats_statements_read_only_their_partial_indexes(seeded: None) -> None:
    with captured() as statements:
        maintenance.reap()
        budgets.unpark_ready()
    expected = {
        "SET outcome = 'orphaned'": {"job_lease_expiry_idx"},
        # The reaper picks its rows FOR NO KEY UPDATE SKIP LOCKED on the partial index, then
        # updates each by primary key (a locked row is skipped, never waited for).
        "SET state = 'queued', scheduled_at": {"job_lease_expiry_idx", "workers_job_pkey"},
        "failure_reason = 'orphaned'": {"job_lease_expiry_idx", "workers_job_pkey"},
        "failure_reason = 'deadline_exceeded'": {"job_queued_deadline_idx", "workers_job_pkey"},
        "park_reason": {"job_parked_idx"},
    }
    seen = {}
    for sql, params in statements:
        for marker, indexes in expected.items():
            if marker in sql and "workers_job" in sql:
                scans = job_scans(plan(sql, params))
                assert {index for _, index in scans} == indexes, (marker, scans)
                seen[marker] = scans
    assert set(seen) == set(expected), statements


def test_the_claim_reads_the_head_of_its_queue_on_the_claim_index(seeded: None) -> None:
    served = [f"{kind}@1" for kind in KINDS]
    with captured() as statements:
        lease = leases.claim_next(queue="default", served=served, worker="w-plan", lease_seconds=30, gated=False)
    assert lease is not None
    sql, params = next((s, p) for s, p in statements if "FOR UPDATE SKIP LOCKED" in s)
    scans = job_scans(plan(sql, params))
    assert ("Index Scan", "job_claim_idx") in scans, scans
    assert all(kind != "Seq Scan" and not kind.startswith("Bitmap") for kind, _ in scans), scans


ATTEMPT_INDEXES = {"attempt_started_idx", "attempt_finished_idx", "attempt_worker_finished_idx", "attempt_live_worker_idx"}


def table_scans(root: dict[str, Any], table: str, prefixes: tuple[str, ...]) -> list[tuple[str, str]]:
    return [
        (node["Node Type"], node.get("Index Name", ""))
        for node in nodes(root)
        if "Scan" in node["Node Type"]
        and (node.get("Relation Name") == table or str(node.get("Index Name", "")).startswith(prefixes))
    ]


# transaction=True: VACUUM (which sets the visibility map, as autovacuum keeps it on a real
# table) cannot run inside the test's transaction, and index-only plans depend on it.
@pytest.mark.django_db(transaction=True)
def test_every_dashboard_statement_is_a_bounded_index_read(seeded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.utils import timezone

    # The sample is 2,000 attempts of a million-job table; 20k jobs keep its proportion with 100
    # (at 2,000 of 20k a hash join over the whole job table is the planner's right call).
    monkeypatch.setattr("console.selectors.dashboard.SAMPLE", 100)

    from console.selectors.dashboard import build_dashboard
    from workers.models import Job, Operation, WorkerProcess

    # What a rolled-back test leaves behind, made here so the plans never depend on test order:
    # 60k dead operation rows (inserted, then deleted).
    Operation.objects.bulk_create(
        [
            Operation(
                job_id=job_id, lease_token=1, name="n", key=f"dead-{job_id}-{n}", kind="email", fingerprint="f", state="succeeded"
            )
            for job_id in Job.objects.values_list("id", flat=True)
            for n in range(3)
        ],
        batch_size=5000,
    )
    Operation.objects.filter(key__startswith="dead-").delete()
    # As in production (and bench/scale.py), most history is older than the dashboard's 24 h:
    # nine finished jobs in ten (and their attempts) move back 30 days.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE workers_job SET finished_at = finished_at - interval '30 days', created_at = created_at - interval '30 days' "
            "WHERE finished_at IS NOT NULL AND id % 10 <> 0"
        )
        cursor.execute(
            "UPDATE workers_attempt a SET started_at = a.started_at - interval '30 days', "
            "finished_at = a.finished_at - interval '30 days' FROM workers_job j WHERE j.id = a.job_id "
            "AND j.finished_at < now() - interval '1 day'"
        )
        # Every table, not only these two: a rolled-back test earlier on this xdist worker leaves
        # dead rows in others (workers_operation, reviews_…), whose pages the planner counts as live
        # rows until a VACUUM, and then it reads their join partners whole.
        cursor.execute("VACUUM ANALYZE")
    now = timezone.now()
    WorkerProcess.objects.create(
        name="w", hostname="h", pid=1, queues=sorted(set(QUEUES)), worker_class="simple", started_at=now, last_seen_at=now
    )
    with captured() as statements:
        board = build_dashboard(now=now)
    assert board.queues and board.workers
    marked = {
        # the per-queue live counts and oldest due job: a walk of the queues, then ranges
        "WITH RECURSIVE queues(queue) AS (\n    (SELECT queue FROM workers_job ORDER BY": "live",
        "ORDER BY started_at DESC LIMIT %(sample)s": "samples",
        "CROSS JOIN LATERAL (\n            SELECT id FROM workers_attempt": "last attempt",
        "AS last_hour": "finished counts",
        "WHERE j.state = 'queued' AND j.queue > q.queue": "due queues",
    }
    seen: dict[str, dict[str, Any]] = {}
    for sql, params in statements:
        if "workers_job" not in sql and "workers_attempt" not in sql:
            continue
        root = plan(sql, params)
        types = [n["Node Type"] for n in nodes(root)]
        jobs = job_scans(root)
        attempts = table_scans(root, "workers_attempt", ("attempt_", "workers_attempt"))
        # Nothing reads either big table whole, nor sorts/uniques it (the old DISTINCT ONs).
        assert all(kind != "Seq Scan" for kind, _ in jobs + attempts), (sql, jobs, attempts)
        assert "Unique" not in types, (sql, types)
        for marker, name in marked.items():
            if marker in sql:
                seen[name] = root
    assert set(seen) == set(marked.values()), sorted(seen)

    live = seen["live"]
    live_types = [n["Node Type"] for n in nodes(live)]
    assert "Recursive Union" in live_types and not {"Aggregate", "Gather"} & {
        n["Node Type"] for n in nodes(live) if n.get("Parent Relationship") == "Outer" and n["Node Type"] == "Gather"
    }
    # Every count reads at most COUNT_CAP + 1 entries of one queue's range; the oldest due job
    # is the first entry of job_queued_due_idx at or before now.
    limits = [n for n in nodes(live) if n["Node Type"] == "Limit"]
    assert len(limits) >= 6, live_types
    assert all(kind.startswith("Index") for kind, _ in job_scans(live)), job_scans(live)
    assert ("Index Only Scan", "job_queued_due_idx") in job_scans(live) or ("Index Scan", "job_queued_due_idx") in job_scans(
        live
    ), job_scans(live)
    # The newest SAMPLE attempts started / finished in the window, each read backwards off its
    # time index and cut by a Limit, then primary-key probes of the jobs.
    samples = seen["samples"]
    scans = table_scans(samples, "workers_attempt", ("attempt_", "workers_attempt"))
    assert sorted(i for _, i in scans) == ["attempt_finished_idx", "attempt_started_idx"], scans
    assert [n["Node Type"] for n in nodes(samples)].count("Limit") == 2, samples
    assert {i for _, i in job_scans(samples)} == {"workers_job_pkey"}, job_scans(samples)
    # The newest finished attempt of each worker: a top-1 descent of attempt_worker_finished_idx
    # per worker, then primary-key probes.
    scans = table_scans(seen["last attempt"], "workers_attempt", ("attempt_", "workers_attempt"))
    assert "attempt_worker_finished_idx" in {i for _, i in scans}, scans
    assert all(kind in ("Index Scan", "Index Only Scan") for kind, _ in scans), scans
    assert {i for _, i in job_scans(seen["finished counts"])} == {"job_finished_cover_idx"}, job_scans(seen["finished counts"])
    # Worker health's "due work waiting": the queues walked on job_claim_idx (as the dispatcher
    # does), then one probe of job_queued_due_idx per queue for its oldest due job.
    due = job_scans(seen["due queues"])
    assert {i for _, i in due} == {"job_claim_idx", "job_queued_due_idx"}, due
    assert all(kind.startswith("Index") for kind, _ in due), due


def test_a_batchs_completion_and_heartbeat_find_their_jobs_by_primary_key() -> None:
    # Joined only to a set-returning function of the batch (jsonb_to_recordset, unnest), whose size
    # the planner guesses at 100 rows, the job table was read whole by a sequential scan while it
    # had no statistics yet or was small (a new or truncated table, a well-pruned one: the live
    # benchmark's case), 1 ms and more per batch. The statements name their ids as an array the
    # planner sizes. No ANALYZE here on purpose: the table is as a fresh deployment's.
    enqueue_many(specs=[JobSpec(kind="noop", input={"i": i}) for i in range(3_000)])
    got = leases.claim_from(
        queues=["default"],
        served=["noop@1"],
        worker="w-plan",
        lease_seconds=30,
        count=4,
        state=leases.ClaimPass.read(),
        batchable=True,
    )
    assert len(got) == 4
    with captured() as statements:
        assert leases.heartbeat_many(held=got, lease_seconds=30) == {lease.job_id for lease in got}
        assert end_attempts([Ending(outcomes.Complete(result=None, state_delta={}), lease) for lease in got]) == [None] * 4
    for marker in ("FROM unnest(", "jsonb_to_recordset("):
        sql, params = next((s, p) for s, p in statements if marker in s)
        scans = job_scans(plan(sql, params))
        assert scans and all(kind != "Seq Scan" for kind, _ in scans), (marker, scans)


def test_the_claims_generic_plan_reads_the_head_of_its_queue_on_the_claim_index(seeded: None) -> None:
    # Prepared (workers/prepared.py), the claim runs on PostgreSQL's generic plan once it is no
    # dearer than the custom ones: that plan, made without the values, must still be the index walk.
    served = [f"{kind}@1" for kind in KINDS]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    with captured() as statements:
        assert leases.claim_next(queue="default", served=served, worker="w-plan", lease_seconds=30, gated=False)
    _sql, params = next((s, p) for s, p in statements if "FOR UPDATE SKIP LOCKED" in s)
    with connection.cursor() as cursor:
        cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = 'koala_claim_next'")
        assert cursor.fetchone()[0] >= 1
    scans = job_scans(plan(engine_sql.PREPARED[engine_sql.CLAIM_NEXT].execute, params))
    assert ("Index Scan", "job_claim_idx") in scans, scans
    assert all(kind != "Seq Scan" and not kind.startswith("Bitmap") for kind, _ in scans), scans


# transaction=True: its rows are truncated afterwards instead of left behind as dead rows of a
# rolled-back transaction, which change the table sizes the other plan tests' planner sees.
@pytest.mark.django_db(transaction=True)
def test_every_prepared_statements_generic_plan_reads_jobs_and_attempts_by_index(seeded: None) -> None:
    # Prepared (workers/prepared.py), a statement runs on its generic plan once PostgreSQL finds it
    # no dearer than the values' own: made without the values, each must still reach its rows
    # through an index, never a table scan.
    served = [f"{kind}@1" for kind in KINDS]
    with connection.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
    try:
        checked = _generic_plans_checked(served)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET plan_cache_mode")
    assert {
        "koala_claim_next_many",
        "koala_heartbeat_many",
        "koala_hold_lease",
        "koala_lease_of_attempt",
        "koala_complete_many",
        "koala_attempt_spans",
        "koala_claim_next",
        "koala_insert_job",
    } <= checked, checked


def _generic_plans_checked(served: list[str]) -> set[str]:
    with captured() as statements:
        got = leases.claim_from(
            queues=["default"],
            served=served,
            worker="w-plan",
            lease_seconds=30,
            count=4,
            state=leases.ClaimPass.read(),
            batchable=True,
        )
        assert len(got) == 4
        leases.heartbeat_many(held=got, lease_seconds=30)
        with transaction.atomic():
            assert leases.hold_lease(job_id=got[0].job_id, lease_token=got[0].lease_token) is None
        assert leases.lease_of(attempt_id=got[0].attempt_id) is not None
        assert end_attempts([Ending(outcomes.Complete(result=None, state_delta={}), lease) for lease in got]) == [None] * 4
        assert leases.claim_next(queue="default", served=served, worker="w-plan", lease_seconds=30, gated=False)
        enqueue_many(specs=[JobSpec(kind="noop", input={})])
    checked = set()
    for statement, params in statements:
        prepared = engine_sql.PREPARED.get(statement)
        if prepared is None or prepared.name in checked:
            continue
        checked.add(prepared.name)
        root = plan(prepared.execute, params)
        scans = table_scans(root, "workers_job", ("job_", "workers_job")) + table_scans(
            root, "workers_attempt", ("attempt_", "workers_attempt")
        )
        assert all(kind != "Seq Scan" for kind, _ in scans), (prepared.name, scans)
    return checked


def test_the_metrics_scrapes_statements_read_only_index_ranges(seeded: None) -> None:
    """The scrape's reads of the engine's tables (metrics.selectors): the live states on their
    partial indexes, the finished ones only past the fold mark, bound as a value (planned as a
    subquery it hashed the whole job table)."""
    from metrics.services import NEGATED_BUCKETS

    with connection.cursor() as cursor:
        cursor.execute("SELECT now(), now() - interval '60 seconds'")
        now, mark = cursor.fetchone()
    tail = {"mark": mark.isoformat()}
    # The queued count reads every queued row whichever way (here a third of the table: the
    # planner may rightly scan it); its per-queue due range and oldest due job are index probes.
    queued = job_scans(plan(engine_sql.METRICS_QUEUED, {"now": now}))
    assert [index for _, index in queued].count("job_queued_due_idx") >= 2, queued
    statements = {
        "running and parked": (engine_sql.METRICS_RUNNING_PARKED, None),
        "orphaned": (engine_sql.METRICS_ORPHANED, {"now": now}),
        "kept tail": (engine_sql.METRICS_KEPT_TAIL, tail),
        "failure tail": (engine_sql.METRICS_FAILURE_TAIL, tail),
        "attempt tail": (engine_sql.METRICS_ATTEMPT_TAIL, {**tail, "negated": NEGATED_BUCKETS}),
        "last ends": (engine_sql.METRICS_LAST_ENDS, None),
    }
    for what, (sql, params) in statements.items():
        root = plan(sql, params)
        scans = [
            (n["Node Type"], n.get("Relation Name", ""), n.get("Index Name", "")) for n in nodes(root) if "Scan" in n["Node Type"]
        ]
        engine = [
            s for s in scans if s[1].startswith("workers_") or s[2].startswith(("job_", "attempt_", "operation_", "workers_"))
        ]
        assert engine, (what, scans)
        # Index-driven reads only (a bitmap heap scan fetches what its index scan found).
        assert all(kind.startswith(("Index", "Bitmap")) for kind, _, _ in engine), (what, scans)
    live = job_scans(plan(engine_sql.METRICS_RUNNING_PARKED))
    assert {index for _, index in live} - {""} == {"job_live_idx"}, live
    failed = job_scans(plan(engine_sql.METRICS_FAILURE_TAIL, tail))
    assert {index for _, index in failed} - {""} == {"job_failed_finished_idx"}, failed
