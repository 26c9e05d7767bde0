"""Metrics scrape benchmark: GET /metrics on a big job table (docs/metrics.md, "What a scrape costs").

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.metrics_scrape [--jobs 1000000] [--reps 200] [--tail 5000] [--reseed]

Not a test: it prints machine information and a markdown table. It seeds ``--jobs`` jobs the way
bench/scale.py does (20% queued, 2% running, 0.2% parked, the rest finished, attempts for every
job that ran; reused while the table holds exactly that many), empties the metrics tallies and
times the first fold of all that history (what a deploy onto an existing database pays once),
then folds up to ``--tail`` attempts short of now, so each scrape also adds a tail of recent
attempts that no fold has passed yet, as a live system's scrape does between two beats. Then, as
p50 / p95 over ``--reps`` repetitions, in the same run:

- the floor: a bare ``SELECT 1`` round trip, and the console's dashboard selector (``build_dashboard``);
- the scrape: ``GET /metrics`` through Django's test client (auth, snapshot, exposition), and the
  snapshot alone (``metrics.selectors.snapshot``);
- a steady fold (the beat task) with nothing new to pass.

It refuses a database whose name lacks "bench" and Redis db 0 unless --force (it TRUNCATEs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.scale import machine, seed, seeded_jobs, timed  # noqa: E402 - after the path set-up above
from bench.setup import guard, setup_django  # noqa: E402

TARGET_P95_MS = 100.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs in the seeded table (default 1,000,000)")
    parser.add_argument("--reps", type=int, default=200, help="repetitions per measurement")
    parser.add_argument("--dashboard-reps", type=int, default=20, help="repetitions of the dashboard selector")
    parser.add_argument("--tail", type=int, default=5000, help="recent attempts left unfolded (the scrape adds them)")
    parser.add_argument("--reseed", action="store_true", help="seed again even if the table holds --jobs jobs")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if args.jobs < 1000 or args.reps < 1 or args.tail < 0:
        parser.error("--jobs must be at least 1000, --reps positive, --tail not negative")
    return args


def main() -> None:
    args = parse_args()
    setup_django(KOALA_METRICS_TOKEN="")  # the test client scrapes from 127.0.0.1: loopback
    guard(force=args.force, database_action="seed and TRUNCATE", redis_action="FLUSHDB")
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from console.selectors.dashboard import build_dashboard
    from metrics import services
    from metrics.selectors import snapshot

    call_command("migrate", interactive=False, verbosity=0)
    if args.reseed or seeded_jobs() != args.jobs:
        print(f"seeding {args.jobs:,} jobs …", file=sys.stderr, flush=True)
        print(f"seeded in {seed(args.jobs):.0f} s", file=sys.stderr, flush=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE metrics_foldmark, metrics_completiontally, metrics_failuretally, metrics_durationtally, "
            "metrics_keptjobtally, metrics_rejectionevent, metrics_rejectiontally"
        )
        # Where to stop the fold so that --tail attempts stay after the mark.
        cursor.execute(
            "SELECT finished_at FROM workers_attempt WHERE finished_at IS NOT NULL ORDER BY finished_at DESC OFFSET %s LIMIT 1",
            [max(args.tail - 1, 0)],
        )
        row = cursor.fetchone()
    until = row[0] if row and args.tail else None
    services.HORIZON_MARGIN_SECONDS = 0.0  # fold right up to "until": the bench is the only writer
    started = time.perf_counter()
    first = services.fold(until=until)
    first_fold = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE metrics_completiontally, metrics_durationtally, metrics_failuretally, metrics_keptjobtally")
        cursor.execute("SELECT count(*) FROM workers_attempt WHERE finished_at >= %s", [first.upto])
        (tail,) = cursor.fetchone()

    client = Client(HTTP_HOST="localhost")
    body = client.get("/metrics")
    assert body.status_code == 200, body.status_code
    lines = [line for line in body.content.decode().splitlines() if line and not line.startswith("#")]

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def scrape() -> None:
        response = client.get("/metrics")
        assert response.status_code == 200

    def steady_fold() -> None:
        services.fold(until=first.upto)

    rows = [
        ("floor", "SELECT 1 round trip", timed(select_one, args.reps)),
        ("floor", "console dashboard selector (build_dashboard)", timed(build_dashboard, args.dashboard_reps, warmup=1)),
        ("metrics", "GET /metrics (auth, snapshot, exposition)", timed(scrape, args.reps)),
        ("metrics", "snapshot alone (metrics.selectors.snapshot)", timed(snapshot, args.reps)),
        ("metrics", "steady fold, nothing new (the beat task)", timed(steady_fold, args.reps)),
    ]
    print(f"# Metrics scrape benchmark, {args.jobs:,} jobs\n")
    print("\n".join(machine()))
    print(f"- the scrape's tail (attempts after the fold mark, added at each scrape): {tail:,}")
    print(f"- one scrape: {len(lines):,} samples, {len(body.content):,} bytes")
    print(f"- first fold of the whole history: {first_fold:.2f} s")
    print(f"- repetitions: {args.reps} ({args.dashboard_reps} for the dashboard)\n")
    print("| group | what | p50 ms | p95 ms |")
    print("| --- | --- | ---: | ---: |")
    for group, what, (p50, p95) in rows:
        print(f"| {group} | {what} | {p50:.2f} | {p95:.2f} |")
    p95 = rows[2][2][1]
    verdict = "within" if p95 <= TARGET_P95_MS else "OVER"
    print(f"\nGET /metrics p95 {p95:.1f} ms: {verdict} the {TARGET_P95_MS:.0f} ms target.")


if __name__ == "__main__":
    main()
