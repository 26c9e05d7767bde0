"""Throughput benchmark: raw RQ against Koala, same machine, same Redis, same worker classes.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.throughput [--jobs 5000] [--workers 2] [--repeat 3]

Not a test: it prints machine information and a markdown table on stdout (see
bench/README.md for what each column means and how the timings are defined).

DESTRUCTIVE for the databases it is pointed at: between variants it runs FLUSHDB on
the Redis database in REDIS_URL and TRUNCATEs Koala's job tables. It refuses a
PostgreSQL database whose name does not contain "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above

RQ_QUEUE = "bench"
RQ_KEY = "koala:bench:rq"
KOALA_KEY = "koala:bench:koala"


# -- set-up --------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per variant (default 5000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per variant (default 2)")
    parser.add_argument("--fork-jobs", type=int, default=None, help="jobs for raw RQ's forking Worker (default jobs/5)")
    parser.add_argument("--repeat", type=int, default=1, help="run every variant this many times; the table shows medians")
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="comma-separated, from: " + ", ".join(VARIANTS) + " (default: %(default)s)",
    )
    parser.add_argument("--profile", metavar="DIR", default=None, help="cProfile every worker's loop into DIR/*.prof")
    parser.add_argument("--commands", action="store_true", help="also print each variant's Redis command breakdown per job")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if args.jobs < 1 or args.workers < 1 or args.repeat < 1:
        parser.error("--jobs, --workers and --repeat must be positive")
    if args.fork_jobs is None:
        args.fork_jobs = max(args.jobs // 5, 1)
    return args


# -- measurements --------------------------------------------------------------------------
def stats_connection() -> tuple[str, Any]:
    """(the bench database's name, an autocommit psycopg connection to the ``postgres`` database
    of the same server): pg_stat_database read from there adds nothing to what it measures."""
    import psycopg
    from django.db import connection

    params = connection.settings_dict
    pg = psycopg.connect(
        dbname="postgres",
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=params.get("PORT") or None,
        autocommit=True,
    )
    return params["NAME"], pg


class Meters:
    """Commits in the bench database (pg_stat_database) and Redis calls (INFO commandstats)."""

    def __init__(self) -> None:
        from redis import Redis

        # Read the statistics from another database, so reading them adds no commit to the bench one.
        self.dbname, self.pg = stats_connection()
        self.redis = Redis.from_url(os.environ["REDIS_URL"])

    def _xact_commit(self) -> int:
        self.pg.execute("SELECT pg_stat_clear_snapshot()")
        row = self.pg.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [self.dbname]).fetchone()
        return int(row[0]) if row else 0

    def commits(self, *, settle: bool) -> int:
        """xact_commit of the bench database; ``settle`` waits until every client has gone and
        flushed its counters (a backend flushes at exit, or about a second after going idle)."""
        if not settle:
            return self._xact_commit()
        from django.db import connection

        connection.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            row = self.pg.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'", [self.dbname]
            ).fetchone()
            if row is None or row[0] == 0:
                break
            time.sleep(0.05)
        value = self._xact_commit()
        while time.monotonic() < deadline:
            time.sleep(0.3)
            again = self._xact_commit()
            if again == value:
                return value
            value = again
        return value

    def redis_calls(self) -> dict[str, int]:
        stats = self.redis.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def redis_idle_rate(self, seconds: float = 1.0) -> float:
        before = self.redis_calls()
        time.sleep(seconds)
        return calls_delta(before, self.redis_calls())[0] / seconds


def calls_delta(before: dict[str, int], after: dict[str, int]) -> tuple[int, dict[str, int]]:
    """Total Redis calls between two snapshots, without the INFO calls the bench itself makes."""
    per = {k: after.get(k, 0) - before.get(k, 0) for k in set(before) | set(after)}
    per = {k: v for k, v in per.items() if v and k != "info"}
    return sum(per.values()), per


# -- worker processes ------------------------------------------------------------------------
class Workers:
    """``count`` pre-started worker processes, held at a barrier until ``go()``."""

    def __init__(self, variant: str, count: int, logdir: Path, profile_dir: str | None) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env.setdefault("LOG_LEVEL", "WARNING")
        if profile_dir:
            env["BENCH_PROFILE_DIR"] = profile_dir
        self.logs = [logdir / f"{variant}-{i}.log" for i in range(count)]
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench._worker", variant, RQ_QUEUE],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(log, "wb"),
                text=True,
            )
            for log in self.logs
        ]
        for proc in self.procs:
            line = self._readline(proc, timeout=60)
            if line.strip() != "ready":
                self.kill()
                raise RuntimeError(f"{variant} worker did not start: {line!r}; see {logdir}")

    def _readline(self, proc: subprocess.Popen[str], timeout: float) -> str:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        return proc.stdout.readline() if ready else ""

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def wait(self, timeout: float) -> list[dict[str, float]]:
        deadline = time.monotonic() + timeout
        times = []
        for proc in self.procs:
            line = self._readline(proc, timeout=max(deadline - time.monotonic(), 0.1))
            if not line:
                self.kill()
                raise RuntimeError(f"a worker did not finish within {timeout:.0f}s; logs: {', '.join(map(str, self.logs))}")
            times.append(json.loads(line))
        for proc in self.procs:
            proc.wait(timeout=30)
        return times

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- variants --------------------------------------------------------------------------------
@dataclass
class Result:
    variant: str
    jobs: int
    enqueue_s: float
    drain_s: float
    e2e_s: float
    commits: int | None
    redis_calls: int
    worker_cpu_s: float
    redis_by_command: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Variant:
    key: str  # for --variants
    name: str
    worker: str  # the _worker.py variant
    enqueue: Callable[[int], None]
    verify: Callable[[int], list[str]]
    koala: bool
    fork_sized: bool = False


def reset(koala: bool) -> None:
    from django.db import connection

    from workers import doorbell

    doorbell.reset_connection()
    doorbell.redis_connection().flushdb()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE workers_attempt, workers_job, workers_workerprocess RESTART IDENTITY CASCADE")
        try:
            cursor.execute("CHECKPOINT")  # start every variant with a clean WAL (needs superuser; optional)
        except Exception:
            pass
    connection.close()


def rq_enqueue(n: int) -> None:
    from redis import Redis
    from rq import Queue

    from bench import bodies

    queue = Queue(RQ_QUEUE, connection=Redis.from_url(os.environ["REDIS_URL"]))
    for _ in range(n):
        queue.enqueue(bodies.incr, RQ_KEY)


def rq_verify(n: int) -> list[str]:
    from redis import Redis
    from rq import Queue

    conn = Redis.from_url(os.environ["REDIS_URL"])
    queue = Queue(RQ_QUEUE, connection=conn)
    problems = []
    counter = int(conn.get(RQ_KEY) or 0)
    if counter != n:
        problems.append(f"redis counter {counter} != {n}")
    if queue.count:
        problems.append(f"{queue.count} messages left in the queue")
    if queue.failed_job_registry.count:
        problems.append(f"{queue.failed_job_registry.count} jobs in the failed registry")
    return problems


def koala_enqueue_one_by_one(n: int) -> None:
    from workers.services.jobs import enqueue

    for _ in range(n):
        enqueue(kind="incr", input={"key": KOALA_KEY})


def koala_enqueue_many(n: int) -> None:
    from workers.services.jobs import JobSpec, enqueue_many

    enqueue_many(specs=[JobSpec(kind="incr", input={"key": KOALA_KEY}) for _ in range(n)])


def koala_verify(n: int) -> list[str]:
    from django.db import connection

    from workers import doorbell

    problems = []
    counter = int(doorbell.redis_connection().get(KOALA_KEY) or 0)
    if counter != n:
        problems.append(f"redis counter {counter} != {n}")
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, count(*), sum(attempts) FROM workers_job GROUP BY state")
        states = {state: (count, used) for state, count, used in cursor.fetchall()}
        cursor.execute("SELECT outcome, count(*) FROM workers_attempt GROUP BY outcome")
        outcomes = dict(cursor.fetchall())
    if set(states) != {"succeeded"} or states["succeeded"][0] != n:
        problems.append(f"job states { ({s: c for s, (c, _) in states.items()}) }, expected {{'succeeded': {n}}}")
    elif states["succeeded"][1] != n:
        problems.append(f"jobs used {states['succeeded'][1]} attempts in total, expected {n}")
    if outcomes != {"succeeded": n}:
        problems.append(f"attempt outcomes {outcomes}, expected {{'succeeded': {n}}}")
    return problems


VARIANTS: dict[str, Variant] = {
    v.key: v
    for v in [
        Variant("rq-simple", "rq SimpleWorker", "rq-simple", rq_enqueue, rq_verify, koala=False),
        Variant("rq-fork", "rq Worker (fork)", "rq-fork", rq_enqueue, rq_verify, koala=False, fork_sized=True),
        Variant("koala-simple", "koala simple, enqueue()", "koala-simple", koala_enqueue_one_by_one, koala_verify, koala=True),
        Variant("koala-simple-many", "koala simple, enqueue_many()", "koala-simple", koala_enqueue_many, koala_verify, True),
        Variant("koala-fork", "koala fork, enqueue()", "koala-fork", koala_enqueue_one_by_one, koala_verify, koala=True),
        Variant("koala-fork-many", "koala fork, enqueue_many()", "koala-fork", koala_enqueue_many, koala_verify, koala=True),
    ]
}
DEFAULT_VARIANTS = ["rq-simple", "rq-fork", "koala-simple", "koala-simple-many", "koala-fork"]
BASELINE = "rq SimpleWorker"


def run_variant(variant: Variant, n: int, workers: int, meters: Meters, logdir: Path, profile_dir: str | None) -> Result:
    reset(variant.koala)
    pool = Workers(variant.worker, workers, logdir, profile_dir)
    try:
        commits_before = meters.commits(settle=True)
        redis_before = meters.redis_calls()
        t0 = time.time()
        variant.enqueue(n)
        t_go = time.time()
        pool.go()
        times = pool.wait(timeout=max(300.0, n / 5))
    finally:
        pool.kill()
    t_end = max(t["end"] for t in times)
    commits = meters.commits(settle=True) - commits_before if variant.koala else None
    calls, by_command = calls_delta(redis_before, meters.redis_calls())
    result = Result(
        variant=variant.name,
        jobs=n,
        enqueue_s=t_go - t0,
        drain_s=t_end - t_go,
        e2e_s=t_end - t0,
        commits=commits,
        redis_calls=calls,
        worker_cpu_s=sum(t["cpu"] for t in times),
        redis_by_command=by_command,
    )
    result.problems = variant.verify(n)
    return result


# -- report ----------------------------------------------------------------------------------
def machine_info(meters: Meters) -> list[str]:
    import django
    import psycopg
    import redis
    import rq
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (pg_version,) = cursor.fetchone()
        cursor.execute(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings "
            "WHERE name IN ('synchronous_commit', 'fsync', 'shared_buffers')"
        )
        (pg_settings,) = cursor.fetchone()
    connection.close()
    server = meters.redis.info("server")
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor() or "?",
        )
        if Path("/proc/cpuinfo").exists()
        else "?"
    )
    from django.conf import settings

    return [
        f"- nproc: {len(os.sched_getaffinity(0))} (cpu_count {os.cpu_count()}, {cpu}), {platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, Django {django.get_version()}, rq {rq.VERSION}, redis-py {redis.__version__}, "
        f"psycopg {psycopg.__version__}",
        f"- PostgreSQL {pg_version} ({pg_settings}), database {meters.dbname}",
        f"- Redis {server.get('redis_version')} at {os.environ['REDIS_URL']}; "
        f"background load {meters.redis_idle_rate():.0f} cmds/s before the run (other clients are counted too)",
        f"- Koala: KOALA_DRAIN_BATCH={settings.KOALA_DRAIN_BATCH}, KOALA_DRAIN_SECONDS={settings.KOALA_DRAIN_SECONDS:g}, "
        f"KOALA_DOORBELL_DEPTH={settings.KOALA_DOORBELL_DEPTH}, "
        f"DATABASE_CONN_MAX_AGE={settings.DATABASES['default']['CONN_MAX_AGE']}",
    ]


def median(values: list[float]) -> float:
    return statistics.median(values)


def fmt_rate(jobs: int, seconds: float) -> str:
    return f"{jobs / seconds:,.0f}" if seconds > 0 else "inf"


def table(results: dict[str, list[Result]], repeat: int, workers: int) -> list[str]:
    header = ["variant", "jobs", "enqueue jobs/s", "drain jobs/s", "end-to-end jobs/s"]
    if repeat > 1:
        header.append(f"e2e min-max ({repeat} runs)")
    header += [f"vs {BASELINE} x{workers} (e2e)", "commits/job", "redis cmds/job", "worker CPU ms/job"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]

    def e2e_rate(runs: list[Result]) -> float:
        return median([r.jobs / r.e2e_s for r in runs])

    base = e2e_rate(results[BASELINE]) if BASELINE in results else None
    for name, runs in results.items():
        jobs = runs[0].jobs
        e2e = e2e_rate(runs)
        row = [
            f"{name} x{workers}",
            f"{jobs:,}",
            f"{median([r.jobs / r.enqueue_s for r in runs]):,.0f}",
            f"{median([r.jobs / r.drain_s for r in runs]):,.0f}",
            f"{e2e:,.0f}",
        ]
        if repeat > 1:
            rates = [r.jobs / r.e2e_s for r in runs]
            row.append(f"{min(rates):,.0f}-{max(rates):,.0f}")
        row.append(f"{e2e / base:.2f}x" if base else "-")
        commits = [r.commits / r.jobs for r in runs if r.commits is not None]
        row.append(f"{median(commits):.2f}" if commits else "-")
        row.append(f"{median([r.redis_calls / r.jobs for r in runs]):.1f}")
        row.append(f"{median([r.worker_cpu_s * 1000 / r.jobs for r in runs]):.2f}")
        if any(r.problems for r in runs):
            row[0] += " **FAILED VERIFY**"
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> int:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; known: {list(VARIANTS)}")
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    meters = Meters()
    info = machine_info(meters)
    logdir = Path(tempfile.mkdtemp(prefix="koala-bench-"))
    results: dict[str, list[Result]] = {VARIANTS[key].name: [] for key in names}
    started = time.monotonic()
    for round_number in range(args.repeat):
        for key in names:
            variant = VARIANTS[key]
            name = variant.name
            n = args.fork_jobs if variant.fork_sized else args.jobs
            result = run_variant(variant, n, args.workers, meters, logdir, args.profile)
            results[name].append(result)
            failed = f"  VERIFY FAILED: {'; '.join(result.problems)}" if result.problems else ""
            print(
                f"[run {round_number + 1}/{args.repeat}] {name}: enqueue {result.enqueue_s:.2f}s, drain {result.drain_s:.2f}s, "
                f"e2e {n / result.e2e_s:,.0f} jobs/s{failed}",
                file=sys.stderr,
                flush=True,
            )
    reset(True)
    print("## Koala throughput benchmark\n")
    print("\n".join(info))
    print(f"- command: {' '.join([Path(sys.executable).name, *sys.argv])}  (total {time.monotonic() - started:.0f}s)")
    print()
    print("\n".join(table(results, args.repeat, args.workers)))
    print()
    print(
        "end-to-end = first enqueue → last worker loop returned (workers are pre-started, held until the enqueue is done, "
        "then run in burst mode); drain = that release → last worker loop returned. Rates are medians over runs."
    )
    problems = [f"{name} run {i + 1}: {p}" for name, runs in results.items() for i, r in enumerate(runs) for p in r.problems]
    if problems:
        print("\nVERIFICATION FAILED:\n" + "\n".join(f"- {p}" for p in problems))
    else:
        print("\nVerified every run: Redis counter == jobs; Koala: every job succeeded with exactly one attempt each.")
    if args.commands:
        print("\nRedis calls per job by command (last run):\n")
        for name, runs in results.items():
            last = runs[-1]
            top = sorted(last.redis_by_command.items(), key=lambda kv: -kv[1])
            print(f"- {name}: " + ", ".join(f"{k} {v / last.jobs:.2f}" for k, v in top if v / last.jobs >= 0.005))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
