"""Flat-cost benchmark: does the engine slow down as finished work piles up?

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.flat [--sizes 10000,100000,1000000] [--drain 3000] [--workers 2] [--reps 300]

Not a test: for each size it seeds that many *finished* jobs (each with one attempt) with INSERT …
SELECT generate_series, VACUUM ANALYZEs, then measures with that table underneath:

- claim and complete latency, p50 / p95 over ``--reps`` alternating calls of Koala's own
  ``leases.claim_next`` and ``transitions.end_attempt`` (in this process);
- drain rate: ``--drain`` jobs (bench.throughput's Redis ``INCR`` body) enqueued with
  ``enqueue_many``, then drained by ``--workers`` koala-simple worker processes (bench._worker);
- each worker's RSS (``/proc/<pid>/status`` VmRSS) when it is ready and at the last sample
  before its loop ends (sampled every 0.2 s during the drain).

It prints a markdown table with each row's ratio to the first (smallest) size. It refuses a
database whose name lacks "bench" and Redis db 0 unless --force: it TRUNCATEs the job tables.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above

_SEED = """
INSERT INTO workers_job (kind, version, queue, input, input_fingerprint, state, priority, delivery, scheduled_at,
    attempts, max_attempts, timeout_seconds, lease_token, progress, run_state, result, usage, error_class, error_message,
    park_detail, parked_on, correlation_id, trace_id, created_by, created_at, updated_at, finished_at)
SELECT 'noop', 1, 'default', '{}', 'x', 'succeeded', 0, 'at_least_once', now() - make_interval(secs => g),
    1, 3, 30, 1, '{}', '{}', '{"ok": true}', '{}', '', '', '', '{}', '', '', 'bench',
    now() - make_interval(secs => g), now() - make_interval(secs => g), now() - make_interval(secs => g)
FROM generate_series(1, %(n)s) AS g
"""
_SEED_ATTEMPTS = """
INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, heartbeat_at, finished_at, outcome,
    error_class, error_message, compute_seconds, db_wait_seconds, storage_wait_seconds, usage)
SELECT id, 1, 'bench-worker', 1, finished_at - interval '0.1 s', finished_at, finished_at, 'succeeded', '', '', 0.01, 0, 0, '{}'
FROM workers_job
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="finished jobs in the table, comma-separated")
    parser.add_argument("--drain", type=int, default=3000, help="jobs drained per size")
    parser.add_argument("--workers", type=int, default=2, help="worker processes draining")
    parser.add_argument("--reps", type=int, default=300, help="claim/complete repetitions per size")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes takes whole numbers separated by commas")
    if min(args.sizes) < 1 or args.drain < 1 or args.workers < 1 or args.reps < 1:
        parser.error("sizes, --drain, --workers and --reps must be positive")
    return args


def seed(n: int) -> float:
    from django.db import connection

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workers_job, workers_attempt, workers_operation, workers_workerprocess RESTART IDENTITY CASCADE")
        cursor.execute(_SEED, {"n": n})
        cursor.execute(_SEED_ATTEMPTS)
        cursor.execute("VACUUM ANALYZE workers_job")
        cursor.execute("VACUUM ANALYZE workers_attempt")
    return time.perf_counter() - started


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def latency(reps: int) -> tuple[tuple[float, float], tuple[float, float]]:
    from bench.scale import percentiles
    from workers import outcomes, transitions
    from workers.services import leases
    from workers.services.jobs import JobSpec, enqueue_many

    enqueue_many(specs=[JobSpec(kind="noop", input={"i": i}) for i in range(reps + 3)])
    claims, completes = [], []
    for rep in range(reps + 3):
        started = time.perf_counter()
        lease = leases.claim_next(queue="default", served=["noop@1"], worker="bench-claimer", lease_seconds=60, gated=False)
        claimed = time.perf_counter()
        assert lease is not None, "nothing to claim"
        assert transitions.end_attempt(outcomes.Complete(result={"ok": True}, state_delta={}), lease) is None
        done = time.perf_counter()
        if rep >= 3:
            claims.append(claimed - started)
            completes.append(done - claimed)
    return percentiles(claims), percentiles(completes)


def drain(n: int, workers: int, logdir: Path) -> tuple[float, list[int], list[int]]:
    from bench.throughput import Workers, koala_enqueue_many
    from workers import doorbell

    doorbell.reset_connection()
    doorbell.redis_connection().flushdb()
    pool = Workers("koala-simple", workers, logdir, None)
    pids = [p.pid for p in pool.procs]
    first = [rss_kib(pid) for pid in pids]
    last = list(first)
    koala_enqueue_many(n)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            for i, pid in enumerate(pids):
                value = rss_kib(pid)
                if value:
                    last[i] = value

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pool.go()
    times = pool.wait(timeout=600)
    stop.set()
    sampler.join()
    seconds = max(t["end"] for t in times) - min(t["start"] for t in times)
    return n / seconds, first, last


def main() -> None:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="TRUNCATEs the job tables", redis_action="FLUSHDBs it")
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", interactive=False, verbosity=0)
    rows = []
    logdir = Path(tempfile.mkdtemp(prefix="koala-bench-flat-"))
    for size in args.sizes:
        print(f"seeding {size:,} finished jobs …", file=sys.stderr, flush=True)
        print(f"seeded in {seed(size):.0f} s", file=sys.stderr, flush=True)
        claim, complete = latency(args.reps)
        rate, rss_start, rss_end = drain(args.drain, args.workers, logdir)
        connection.close()
        rows.append((size, rate, claim, complete, rss_start, rss_end))
        print(f"{size:,}: {rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    base = rows[0]
    print(f"# Flat-cost benchmark: {args.drain:,} jobs drained by {args.workers} workers, {args.reps} claim/complete pairs\n")
    print(
        "| finished jobs in the table | drain jobs/s | claim p50 / p95 ms | complete p50 / p95 ms "
        "| worker RSS start → end MiB | vs the first row (drain, claim p50, complete p50) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for size, rate, claim, complete, start, end in rows:
        rss = ", ".join(f"{s / 1024:.0f} → {e / 1024:.0f}" for s, e in zip(start, end, strict=True))
        ratios = f"{rate / base[1]:.2f}x / {claim[0] / base[2][0]:.2f}x / {complete[0] / base[3][0]:.2f}x"
        timings = f"{claim[0]:.2f} / {claim[1]:.2f} | {complete[0]:.2f} / {complete[1]:.2f}"
        print(f"| {size:,} | {rate:,.0f} | {timings} | {rss} | {ratios} |")


if __name__ == "__main__":
    main()
