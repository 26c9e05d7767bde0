"""Retention benchmark: pruning a million-job backlog while a worker claims and completes.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.prune [--jobs 1000000] [--batch-size 1000] [--baseline-seconds 10]

Not a test: it prints machine information and a markdown table (bench/README.md, "Retention
benchmark"). It seeds ``--jobs`` jobs as bench/scale.py does (about three in four finished, with
their attempts), moves every finished job 60 days back, and then, in the same run:

1. **baseline**: a live worker thread claims and completes seeded queued jobs through Koala's own
   services (``leases.claim_next``, ``transitions.end_attempt``) for ``--baseline-seconds``;
2. **during pruning**: the same worker goes on while the main thread prunes the whole backlog with
   ``workers.services.retention.prune`` (the beat's and ``koala_prune``'s pass) at
   ``--batch-size`` jobs a batch, until nothing is left to prune.

Reported: jobs and attempts deleted per second; the worker's claim+complete cycle p50 / p95 / max
in both phases and their ratio; and lock waits seen by the worker's database session (a sampler
reads ``pg_stat_activity`` every 10 ms: samples where the worker's backend waited on a lock).
It refuses a database whose name lacks "bench" and Redis db 0 unless --force (it TRUNCATEs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1000, help="jobs per prune batch (KOALA_RETENTION_BATCH_SIZE)")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--force", action="store_true", help="allow a database without 'bench' in its name")
    return parser.parse_args()


class LiveWorker(threading.Thread):
    """Claims and completes queued jobs in a loop on its own connection, timing each cycle."""

    def __init__(self, served: list[str], queues: list[str]) -> None:
        super().__init__(daemon=True)
        self.served, self.queues = served, queues
        self.samples: list[tuple[float, float]] = []  # (when it started, how long it took)
        self.backend_pid = 0
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connection

        from workers import outcomes, transitions
        from workers.services import leases

        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.backend_pid = cursor.fetchone()[0]
            self.ready.set()
            turn = 0
            while not self.stop.is_set():
                queue = self.queues[turn % len(self.queues)]
                turn += 1
                started = time.perf_counter()
                lease = leases.claim_next(queue=queue, served=self.served, worker="bench-live", lease_seconds=60, gated=False)
                if lease is None:
                    continue
                rejection = transitions.end_attempt(outcomes.Complete(result={"ok": True}, state_delta={}), lease)
                assert rejection is None, rejection
                self.samples.append((started, time.perf_counter() - started))
        except BaseException as error:  # reported by the main thread
            self.error = error
            self.ready.set()
        finally:
            connection.close()


class LockSampler(threading.Thread):
    """Every 10 ms: is the worker's backend waiting on a lock (pg_stat_activity)?"""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples = 0
        self.waits: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                while not self.stop.is_set():
                    cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [self.pid])
                    row = cursor.fetchone()
                    self.samples += 1
                    if row and row[0] == "Lock":
                        self.waits.append(time.perf_counter())
                    time.sleep(0.01)
        finally:
            connection.close()


def cycle_stats(samples: list[tuple[float, float]], start: float, end: float) -> tuple[int, float, float, float]:
    took = sorted(d for at, d in samples if start <= at < end)
    if not took:
        return 0, 0.0, 0.0, 0.0
    p95 = took[min(len(took) - 1, round(0.95 * (len(took) - 1)))]
    return len(took), statistics.median(took) * 1000, p95 * 1000, took[-1] * 1000


def main() -> None:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="seed and TRUNCATE", redis_action="FLUSHDB")
    from django.core.management import call_command
    from django.db import connection

    from bench.scale import KINDS, machine, seed
    from workers.services import retention

    call_command("migrate", interactive=False, verbosity=0)
    print(f"seeding {args.jobs:,} jobs …", file=sys.stderr, flush=True)
    print(f"seeded in {seed(args.jobs):.0f} s", file=sys.stderr, flush=True)
    with connection.cursor() as cursor:
        began = time.perf_counter()
        cursor.execute(
            "UPDATE workers_job SET finished_at = finished_at - interval '60 days', created_at = created_at - interval '60 days' "
            "WHERE finished_at IS NOT NULL"
        )
        aged = cursor.rowcount
        cursor.execute(
            "SELECT count(*) FROM workers_attempt a JOIN workers_job j ON j.id = a.job_id WHERE j.finished_at IS NOT NULL"
        )
        aged_attempts = cursor.fetchone()[0]
        cursor.execute("VACUUM ANALYZE workers_job")
        cursor.execute("VACUUM ANALYZE workers_attempt")
        print(f"aged {aged:,} finished jobs in {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
    connection.close()

    machine_lines = machine()  # before the pruning: the table sizes it starts from
    served = sorted({f"{kind}@1" for kind, _, _ in KINDS})
    queues = sorted({queue for _, queue, _ in KINDS if queue != "exports"})
    worker = LiveWorker(served, queues)
    worker.start()
    worker.ready.wait()
    if worker.error:
        raise worker.error
    sampler = LockSampler(worker.backend_pid)
    sampler.start()

    baseline_start = time.perf_counter()
    time.sleep(args.baseline_seconds)
    prune_start = time.perf_counter()
    jobs = attempts = operations = passes = 0
    while True:
        report = retention.prune(days=30, batch_size=args.batch_size, batches=100)
        passes += 1
        jobs += report.jobs
        attempts += report.attempts
        operations += report.operations
        if report.jobs == 0:
            break
    prune_end = time.perf_counter()
    worker.stop.set()
    sampler.stop.set()
    worker.join(timeout=30)
    sampler.join(timeout=30)
    if worker.error:
        raise worker.error
    elapsed = prune_end - prune_start

    base = cycle_stats(worker.samples, baseline_start, prune_start)
    during = cycle_stats(worker.samples, prune_start, prune_end)
    waits = sum(1 for at in sampler.waits if prune_start <= at < prune_end)
    print(f"# Retention benchmark: pruning {aged:,} finished jobs ({aged_attempts:,} attempts) of {args.jobs:,}\n")
    print("\n".join(machine_lines))
    print(f"- batch size {args.batch_size}, {passes} passes of up to 100 batches; one live worker claiming and completing\n")
    print("| what | value |")
    print("|---|---:|")
    print(f"| jobs pruned | {jobs:,} |")
    print(f"| attempts pruned | {attempts:,} |")
    print(f"| time | {elapsed:.1f} s |")
    print(f"| jobs pruned/s | {jobs / elapsed:,.0f} |")
    print(f"| job+attempt rows deleted/s | {(jobs + attempts) / elapsed:,.0f} |")
    print(f"| worker cycles, baseline ({base[0]:,}) p50 / p95 / max ms | {base[1]:.2f} / {base[2]:.2f} / {base[3]:.1f} |")
    during_ms = f"{during[1]:.2f} / {during[2]:.2f} / {during[3]:.1f}"
    print(f"| worker cycles, while pruning ({during[0]:,}) p50 / p95 / max ms | {during_ms} |")
    ratio50 = during[1] / base[1] if base[1] else 0.0
    ratio95 = during[2] / base[2] if base[2] else 0.0
    print(f"| cycle p50 / p95 while pruning vs baseline | {ratio50:.2f}x / {ratio95:.2f}x |")
    print(f"| worker lock-wait samples while pruning (every 10 ms) | {waits} of {sampler.samples:,} in all |")


if __name__ == "__main__":
    main()
