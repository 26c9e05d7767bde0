"""What PgBouncer in transaction mode costs: N no-op jobs drained direct, direct without prepared
statements, and through PgBouncer 1.18 (pool_mode=transaction), in one run.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.pgbouncer [--jobs 3000] [--workers 2] [--repeat 2]

Not a test: it prints a markdown table (bench/README.md, "PgBouncer benchmark"). Each variant
enqueues ``--jobs`` jobs of the ``incr`` kind with one ``enqueue_many()``, then releases
``--workers`` pre-started ``koala_worker --burst`` processes (bench/throughput.py's) and times
the drain. The variants alternate within each round, each round starting with the next one, so
they share the machine's state and none always runs first.
The PgBouncer variant's workers log in as a role of their own whose settings are the session
bounds (docs/scaling.md, "PgBouncer"); the role is dropped at the end.

DESTRUCTIVE like bench/throughput.py: FLUSHDB on REDIS_URL's database and TRUNCATE of Koala's
job tables; it refuses a database whose name lacks "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402
from bench.throughput import Workers, koala_enqueue_many, koala_verify, reset  # noqa: E402

VARIANTS = ["direct", "direct, no prepared statements", "PgBouncer (transaction)"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--force", action="store_true", help="allow a database/Redis db the guard refuses")
    args = parser.parse_args()
    if min(args.jobs, args.workers, args.repeat) < 1:
        parser.error("--jobs, --workers and --repeat must be positive")
    return args


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """os.environ with ``values`` (what bench.throughput.Workers hands its processes)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def drain(n: int, workers: int, logdir: Path, label: str) -> tuple[float, list[str]]:
    reset(True)
    koala_enqueue_many(n)
    pool = Workers("koala-simple", workers, logdir, None)
    try:
        start = time.time()
        pool.go()
        times = pool.wait(timeout=max(300.0, n / 5))
    finally:
        pool.kill()
    seconds = max(t["end"] for t in times) - start
    problems = koala_verify(n)
    print(f"{label}: {n / seconds:,.0f} jobs/s{'  VERIFY FAILED: ' + '; '.join(problems) if problems else ''}", file=sys.stderr)
    return seconds, problems


def main() -> int:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    from django.db import connection

    from tests.dburl import database_url
    from tests.support.pgbouncer import running, worker_role
    from workers.dbsession import session_bounds

    params = dict(connection.settings_dict)
    role = f"koala_bench_pgbouncer_{os.getpid()}"
    logdir = Path(tempfile.mkdtemp(prefix="koala-bench-pgbouncer-"))
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    problems: list[str] = []
    started = time.monotonic()
    with worker_role(params, role, session_bounds()), running(params, users=[params["USER"], role], pool_size=20) as bouncer:
        version = subprocess.run([bouncer.binary, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        settings_for = {
            VARIANTS[0]: {
                "DATABASE_URL": database_url(params),
                "KOALA_DATABASE_POOLING": "direct",
                "KOALA_PREPARED_STATEMENTS": "true",
            },
            VARIANTS[1]: {
                "DATABASE_URL": database_url(params),
                "KOALA_DATABASE_POOLING": "direct",
                "KOALA_PREPARED_STATEMENTS": "false",
            },
            VARIANTS[2]: {
                "DATABASE_URL": bouncer.url(user=role),
                "KOALA_DATABASE_POOLING": "transaction",
                "KOALA_PREPARED_STATEMENTS": "false",
            },
        }
        for round_number in range(args.repeat):
            # Each round starts with the next variant: no variant always runs first (or last).
            shift = round_number % len(VARIANTS)
            for name in VARIANTS[shift:] + VARIANTS[:shift]:
                with environment(**settings_for[name]):
                    took, found = drain(args.jobs, args.workers, logdir, f"[round {round_number + 1}] {name}")
                seconds[name].append(took)
                problems += [f"{name} round {round_number + 1}: {p}" for p in found]
    reset(True)
    base = statistics.median(seconds[VARIANTS[0]])
    print("## PgBouncer benchmark\n")
    print(f"- {version}, pool_mode=transaction, default_pool_size=20, on 127.0.0.1 beside PostgreSQL")
    print(
        f"- {args.jobs:,} no-op (`incr`) jobs per run, enqueue_many(), "
        f"{args.workers} koala simple workers (--burst), {args.repeat} rounds"
    )
    print(f"- command: {' '.join([Path(sys.executable).name, *sys.argv])}  (total {time.monotonic() - started:.0f}s)\n")
    print("| variant | drain jobs/s (median) | min-max | vs direct |")
    print("|---|---:|---:|---:|")
    for name in VARIANTS:
        rates = [args.jobs / s for s in seconds[name]]
        print(
            f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f}-{max(rates):,.0f} | "
            f"{base / statistics.median(seconds[name]):.2f}x |"
        )
    if problems:
        print("\nVERIFICATION FAILED:\n" + "\n".join(f"- {p}" for p in problems))
        return 1
    print("\nVerified every run: every job succeeded with exactly one attempt; the Redis counter equals the jobs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
