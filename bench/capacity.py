"""Capacity experiment: export concurrency 1, 2, 4 under the same backlog and the same HTTP traffic.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.capacity [--levels 1,2,4] [--duration 60] [--warmup 5] [--repeat 1] [--quick]

Not a test: it prints machine information, one markdown table and the stop rule's verdict on
stdout (docs/exports.md, "Capacity: set the budget before adding processes"). For each level N:

- the exports budget (scope queue, target ``exports``) gets ``concurrency_limit = N`` and N
  ``koala_worker --queues exports`` processes run, beside one ``koala_worker --queues default``
  for the small jobs and one ``koala_beat``, as a deployment would;
- a backlog of exports of several sizes (``--sizes``, in the proportions ``--mix``) is kept at
  ``--backlog`` queued exports for the whole level, and small ``incr`` jobs arrive on their own
  queue (``default``) at ``--small-rate`` per second;
- one uvicorn process serving ``koala.asgi`` (as ``koala_run`` serves it; started once for the
  whole run) gets the same traffic at every level: ``--http-rate`` GETs per second, cycling
  through the console's dashboard, ``GET /api/v1/jobs/<id>`` (the newest small job), the
  console's exports page and the API again, from one keep-alive client;
- after ``--warmup`` seconds, a window of ``--duration`` seconds is measured: exports that
  finished in it, the oldest due job's age per queue and the export workers' RSS (sampled each
  second), HTTP latency, failures, the export attempts' own time split (compute / database wait /
  storage wait, recorded by the engine on each attempt) and host CPU from /proc/stat.

With ``--repeat R`` every level runs R times, the order reversed each time (1,2,4,4,2,1, ...), so
a load that drifts on a shared host weighs on every level alike; the table pools the runs and
shows each run's exports/min.

The verdict: adding concurrency stopped paying at the first level whose exports/min rose less
than 15 % over the previous level while the database wait per export or the HTTP p95 grew;
the recommended budget default is the level before it.

DESTRUCTIVE for the databases it is pointed at: it TRUNCATEs Koala's job tables (and with them
the exports) and FLUSHDBs the Redis db between levels; it refuses a database name without
"bench" and Redis db 0 unless --force. It creates the demo accounts capacity-<rows> (reused
when they hold exactly that many events) and writes the exports into a temporary folder,
deleting each published file as soon as it is counted.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above
from bench.worker_api import Server  # noqa: E402

YEAR = (date(2026, 1, 1), date(2026, 12, 31))
MIB = 1024 * 1024
KEY = "koala:bench:capacity"  # the small jobs' counter
USER = "bench-capacity"
EXPORTS_QUEUE, SMALL_QUEUE = "exports", "default"
# The stop rule: a level pays when its exports/min is at least this much above the previous level's.
PAYS = 0.15
PAGES = ("/admin/console/", "/admin/console/exports/")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--levels", default=None, help="export concurrency levels, comma-separated, run in this order (default 1,2,4)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of every level, the order reversed each time (default 1); pooled"
    )
    parser.add_argument("--duration", type=float, default=None, help="measured seconds per level (default 60)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds per level before the window (default 5)")
    parser.add_argument("--sizes", default=None, help="rows of the exports in the backlog (default 10000,100000,1000000)")
    parser.add_argument("--mix", default="4,2,1", help="how many of each size per cycle of the backlog (default 4,2,1)")
    parser.add_argument("--backlog", type=int, default=None, help="queued exports kept at all times (default 24)")
    parser.add_argument("--small-rate", type=float, default=5.0, help="small jobs enqueued per second (default 5)")
    parser.add_argument("--http-rate", type=float, default=4.0, help="GET requests per second (default 4)")
    parser.add_argument("--web-workers", type=int, default=1, help="uvicorn processes (default 1, as koala_run)")
    parser.add_argument("--quick", action="store_true", help="a tiny run (levels 1,2, 3 s each, small exports): the smoke test")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    quick = args.quick
    args.levels = [int(n) for n in (args.levels or ("1,2" if quick else "1,2,4")).split(",") if n.strip()]
    args.duration = args.duration if args.duration is not None else (3.0 if quick else 60.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if quick else 5.0)
    args.sizes = [int(n) for n in (args.sizes or ("1000,3000,10000" if quick else "10000,100000,1000000")).split(",")]
    args.mix = [int(n) for n in args.mix.split(",")]
    args.backlog = args.backlog if args.backlog is not None else (4 if quick else 24)
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 16 or len(set(args.levels)) != len(args.levels):
        parser.error("--levels must be distinct numbers between 1 and 16")
    if len(args.mix) != len(args.sizes) or min(args.mix) < 0 or sum(args.mix) < 1 or min(args.sizes) < 1:
        parser.error("--mix needs one non-negative count per size (and --sizes positive)")
    if args.repeat < 1:
        parser.error("--repeat must be positive")
    if args.duration <= 0 or args.warmup < 0 or args.backlog < 1 or args.small_rate <= 0 or args.http_rate <= 0:
        parser.error("--duration, --backlog, --small-rate and --http-rate must be positive")
    return args


# -- set-up ------------------------------------------------------------------------------------
def prepare_data(sizes: list[int]) -> dict[int, Any]:
    """One account per size holding exactly that many events (made once, then reused)."""
    from django.contrib.auth.models import User
    from django.db.models import Count

    from exports.demo_data import generate_events
    from exports.models import Account, Event

    User.objects.get_or_create(username=USER, defaults={"is_superuser": True, "is_staff": True})
    accounts = {}
    for size in sorted(set(sizes)):
        account, _ = Account.objects.get_or_create(slug=f"capacity-{size}", defaults={"name": f"Capacity {size:,} rows"})
        have = Event.objects.filter(account=account).aggregate(n=Count("id"))["n"]
        if have != size:
            Event.objects.filter(account=account).delete()
            made = generate_events(rows=size, accounts=[account], seed=size)
            print(f"generated {size:,} events for {account.slug} in {made.seconds:.1f} s", file=sys.stderr)
        accounts[size] = account
    return accounts


def exports_budget() -> int:
    """The id of the exports queue's budget (every tenant), created without limits if missing."""
    from workers.models import Budget, Scope
    from workers.services.budgets import create_budget

    found = Budget.objects.filter(scope=Scope.QUEUE, target=EXPORTS_QUEUE, tenant="").first()
    if found is None:
        found = create_budget(name="exports", scope=Scope.QUEUE, target=EXPORTS_QUEUE, actor=USER)
    return int(found.pk)


def credentials() -> tuple[str, str]:
    """A console session cookie for the bench's superuser and an API key that may read jobs."""
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.test import Client

    from api import keys

    client = Client()
    client.force_login(User.objects.get(username=USER))  # a real session row, as a login makes
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    _, key = keys.create_key(name="bench capacity", scopes=["execute"], actor=USER)
    return cookie, key


def reset(storage: Path) -> None:
    from django.db import connection

    from workers import doorbell

    doorbell.reset_connection()
    doorbell.redis_connection().flushdb()
    with connection.cursor() as cursor:
        # CASCADE: the exports, operations and spans that point at the jobs go with them.
        cursor.execute("TRUNCATE workers_attempt, workers_job, workers_workerprocess RESTART IDENTITY CASCADE")
    connection.close()
    for folder in ("exports", "tmp"):
        shutil.rmtree(storage / folder, ignore_errors=True)


# -- the processes ------------------------------------------------------------------------------
class Processes:
    """The level's worker and beat processes (manage.py commands), always stopped at the end."""

    def __init__(self, logdir: Path, env: dict[str, str]) -> None:
        self.logdir, self.env = logdir, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *command: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *command],
            cwd=ROOT,
            env=self.env,
            stdout=open(self.logdir / f"{name}.log", "ab"),
            stderr=subprocess.STDOUT,
        )
        self.procs[name] = proc
        return proc

    def worker(self, name: str, queue: str) -> subprocess.Popen[bytes]:
        return self.start(name, "koala_worker", "--queues", queue, "--name", name)

    def wait_registered(self, names: list[str], timeout: float = 120) -> None:
        from workers.models import WorkerProcess

        deadline = time.monotonic() + timeout
        while True:
            live = set(WorkerProcess.objects.filter(name__in=names, stopped_at__isnull=True).values_list("name", flat=True))
            if live == set(names):
                return
            dead = [n for n in names if self.procs[n].poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"worker(s) {', '.join(dead or sorted(set(names) - live))} did not start; see {self.logdir}")
            time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60  # a running export finishes first (the worker's graceful stop)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()


def tree_rss(pid: int) -> int:
    """RSS in bytes of a process and its children (a forking worker's work horse included)."""
    import psutil

    try:
        process = psutil.Process(pid)
        total = process.memory_info().rss
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return int(total)
    except psutil.NoSuchProcess:
        return 0


def cpu_times() -> tuple[int, int, int]:
    """(total, idle, iowait) jiffies of all CPUs, from /proc/stat's first line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already inside user/nice)
    return sum(fields[:8]), fields[3], fields[4]


# -- the load: backlog, small jobs, HTTP traffic --------------------------------------------------
class Backlog(threading.Thread):
    """Keeps ``depth`` exports queued, requesting them in the same repeating order of sizes; it
    looks every 0.1 s and counts the looks that found the queue empty (the backlog ran dry)."""

    def __init__(self, accounts: dict[int, Any], sizes: list[int], mix: list[int], depth: int) -> None:
        super().__init__(name="backlog", daemon=True)
        from django.contrib.auth.models import User

        self.cycle = [accounts[size] for size, count in zip(sizes, mix, strict=True) for _ in range(count)]
        self.depth, self.next = depth, 0
        self.user = User.objects.get(username=USER)
        self.stop = threading.Event()
        self.counting = threading.Event()  # set for the measured window
        self.looks = self.dry = 0
        self.error: BaseException | None = None
        self.refill()

    def refill(self) -> None:
        from exports.models import Export, ExportState
        from exports.services import request_export

        queued = Export.objects.filter(state=ExportState.QUEUED).count()
        if self.counting.is_set():
            self.looks += 1
            self.dry += queued == 0
        for _ in range(max(0, self.depth - queued)):
            account = self.cycle[self.next % len(self.cycle)]
            self.next += 1
            request_export(user=self.user, account_id=account.pk, date_from=YEAR[0], date_to=YEAR[1])

    def run(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(0.1):
                self.refill()
        except BaseException as exc:  # reported by the level: a backlog that stopped is not a measurement
            self.error = exc
        finally:
            connection.close()


class Arrivals(threading.Thread):
    """Small ``incr`` jobs on their own queue at a steady rate; remembers the newest job's id."""

    def __init__(self, rate: float) -> None:
        super().__init__(name="arrivals", daemon=True)
        self.interval = 1.0 / rate
        self.stop = threading.Event()
        self.errors = 0
        from workers.services.jobs import enqueue

        self.newest = enqueue(kind="incr", input={"key": KEY}, queue=SMALL_QUEUE, created_by=USER).job_id

    def run(self) -> None:
        from django.db import connection

        from workers.services.jobs import enqueue

        due = time.monotonic()
        try:
            while not self.stop.is_set():
                due += self.interval
                self.stop.wait(max(0.0, due - time.monotonic()))
                try:
                    self.newest = enqueue(kind="incr", input={"key": KEY}, queue=SMALL_QUEUE, created_by=USER).job_id
                except Exception:
                    self.errors += 1
        finally:
            connection.close()


@dataclass
class Traffic:
    api: list[float] = field(default_factory=list)
    pages: list[float] = field(default_factory=list)
    failures: int = 0
    problems: list[str] = field(default_factory=list)


class Visitor(threading.Thread):
    """One keep-alive client replaying the same GETs at a fixed rate (the next waits for the last)."""

    def __init__(self, port: int, rate: float, cookie: str, key: str, arrivals: Arrivals) -> None:
        super().__init__(name="visitor", daemon=True)
        self.port, self.interval, self.cookie, self.key, self.arrivals = port, 1.0 / rate, cookie, key, arrivals
        self.stop = threading.Event()
        self.traffic = Traffic()

    def get(self, conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> tuple[int, float]:
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - started

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        due, n = time.monotonic(), 0
        while not self.stop.is_set():
            page = n % 2 == 0
            path = PAGES[(n // 2) % len(PAGES)] if page else f"/api/v1/jobs/{self.arrivals.newest}"
            headers = {"Cookie": self.cookie} if page else {"Authorization": f"Bearer {self.key}"}
            n += 1
            try:
                try:
                    status, seconds = self.get(conn, path, headers)
                except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                    conn.close()  # the server closed the idle keep-alive connection: reconnect once
                    status, seconds = self.get(conn, path, headers)
            except Exception as exc:
                conn.close()
                self.traffic.failures += 1
                self.traffic.problems.append(f"{path}: {type(exc).__name__}")
            else:
                (self.traffic.pages if page else self.traffic.api).append(seconds)
                if status != 200:
                    self.traffic.failures += 1
                    self.traffic.problems.append(f"{path}: HTTP {status}")
            due = max(due + self.interval, time.monotonic())
            self.stop.wait(max(0.0, due - time.monotonic()))
        conn.close()


# -- one level -------------------------------------------------------------------------------------
@dataclass
class Level:
    concurrency: int
    seconds: float
    exports: int = 0
    rows: int = 0
    exports_failed: int = 0
    attempts_failed: int = 0
    small_done: int = 0
    small_failed: int = 0
    small_e2e: list[float] = field(default_factory=list)
    ages: dict[str, list[float]] = field(default_factory=dict)
    rss_per_export: list[float] = field(default_factory=list)
    split: tuple[float, float, float] = (0.0, 0.0, 0.0)  # per export: compute, db wait, storage wait
    traffic: Traffic = field(default_factory=Traffic)
    cpu_busy: float = 0.0
    cpu_iowait: float = 0.0
    load: float = 0.0
    dry: float = 0.0  # share of the window's looks that found no export queued
    split_n: int = 0  # the succeeded export attempts the split is the mean of
    runs: list[float] = field(default_factory=list)  # exports/min of each repetition, in run order

    @property
    def per_minute(self) -> float:
        return self.exports * 60.0 / self.seconds

    @property
    def failures(self) -> int:
        return self.exports_failed + self.small_failed + self.traffic.failures


def pooled(runs: list[Level]) -> Level:
    """The repetitions of one level as one window: counts and samples pooled, rates over the total time."""
    if len(runs) == 1:
        return runs[0]
    seconds = sum(r.seconds for r in runs)
    n = sum(r.split_n for r in runs)
    compute, db, storage = (sum(r.split[i] * r.split_n for r in runs) / n if n else 0.0 for i in range(3))
    return Level(
        concurrency=runs[0].concurrency,
        seconds=seconds,
        exports=sum(r.exports for r in runs),
        rows=sum(r.rows for r in runs),
        exports_failed=sum(r.exports_failed for r in runs),
        attempts_failed=sum(r.attempts_failed for r in runs),
        small_done=sum(r.small_done for r in runs),
        small_failed=sum(r.small_failed for r in runs),
        small_e2e=[v for r in runs for v in r.small_e2e],
        ages={q: [v for r in runs for v in r.ages[q]] for q in runs[0].ages},
        rss_per_export=[v for r in runs for v in r.rss_per_export],
        split=(compute, db, storage),
        traffic=Traffic(
            api=[v for r in runs for v in r.traffic.api],
            pages=[v for r in runs for v in r.traffic.pages],
            failures=sum(r.traffic.failures for r in runs),
            problems=[p for r in runs for p in r.traffic.problems],
        ),
        cpu_busy=sum(r.cpu_busy * r.seconds for r in runs) / seconds,
        cpu_iowait=sum(r.cpu_iowait * r.seconds for r in runs) / seconds,
        load=sum(r.load for r in runs) / len(runs),
        dry=sum(r.dry for r in runs) / len(runs),
        split_n=n,
        runs=[v for r in runs for v in r.runs],
    )


def oldest_ages() -> dict[str, float]:
    """Seconds the oldest due, queued job of each measured queue has waited (0 when none)."""
    from django.db.models import Min
    from django.utils import timezone

    from workers.models import Job, JobState

    now = timezone.now()
    ages = {}
    for queue in (EXPORTS_QUEUE, SMALL_QUEUE):
        oldest = Job.objects.filter(queue=queue, state=JobState.QUEUED, scheduled_at__lte=now).aggregate(at=Min("scheduled_at"))
        ages[queue] = (now - oldest["at"]).total_seconds() if oldest["at"] else 0.0
    return ages


def delete_published(storage: Path, after: int) -> int:
    """Remove the files of exports that succeeded since ``after`` (their records stay)."""
    from exports.models import Export, ExportState

    last = after
    for pk, key in Export.objects.filter(pk__gt=after, state=ExportState.SUCCEEDED).values_list("pk", "output_key"):
        (storage / key).unlink(missing_ok=True)
        last = max(last, pk)
    return last


def run_level(
    concurrency: int, args: argparse.Namespace, ctx: dict[str, Any], storage: Path, logdir: Path, env: dict[str, str]
) -> Level:
    from django.db.models import Count, Q, Sum
    from django.utils import timezone

    from exports.models import Export, ExportState
    from workers.models import Attempt, Job, JobState, Outcome
    from workers.services.budgets import update_budget

    reset(storage)
    update_budget(budget_id=ctx["budget"], actor=USER, concurrency_limit=concurrency)
    processes = Processes(logdir, env)
    names = [f"cap{concurrency}-export-{i}" for i in range(concurrency)]
    try:
        export_pids = [processes.worker(name, EXPORTS_QUEUE).pid for name in names]
        processes.worker(f"cap{concurrency}-small", SMALL_QUEUE)
        processes.start(f"cap{concurrency}-beat", "koala_beat")
        processes.wait_registered([*names, f"cap{concurrency}-small"])
        backlog = Backlog(ctx["accounts"], args.sizes, args.mix, args.backlog)
        backlog.start()
        arrivals = Arrivals(args.small_rate)
        arrivals.start()
        level = Level(concurrency=concurrency, seconds=args.duration, ages={EXPORTS_QUEUE: [], SMALL_QUEUE: []})
        deleted = 0
        warm_until = time.monotonic() + args.warmup
        while time.monotonic() < warm_until:
            deleted = delete_published(storage, deleted)
            time.sleep(0.5)
        visitor = Visitor(ctx["port"], args.http_rate, ctx["cookie"], ctx["key"], arrivals)
        visitor.start()
        t0, cpu0 = timezone.now(), cpu_times()
        backlog.counting.set()
        end = time.monotonic() + args.duration
        while (now := time.monotonic()) < end:
            tick = now + 1.0
            for queue, age in oldest_ages().items():
                level.ages[queue].append(age)
            running = Job.objects.filter(queue=EXPORTS_QUEUE, state=JobState.RUNNING).count()
            if running:
                level.rss_per_export.append(sum(tree_rss(pid) for pid in export_pids) / running / MIB)
            deleted = delete_published(storage, deleted)
            time.sleep(max(0.0, min(tick, end) - time.monotonic()))
        t1, cpu1 = timezone.now(), cpu_times()
        backlog.counting.clear()
        level.seconds = (t1 - t0).total_seconds()
        level.load = os.getloadavg()[0]
        visitor.stop.set()
        arrivals.stop.set()
        backlog.stop.set()
        visitor.join(timeout=90)
        arrivals.join(timeout=30)
        backlog.join(timeout=30)
        if backlog.error is not None:
            raise RuntimeError("the backlog stopped being refilled") from backlog.error
        level.dry = backlog.dry / backlog.looks if backlog.looks else 0.0
        level.traffic = visitor.traffic
        level.small_failed += arrivals.errors
    finally:
        processes.stop()
    total, idle, iowait = (b - a for a, b in zip(cpu0, cpu1, strict=True))
    level.cpu_busy = 1.0 - (idle + iowait) / total if total else 0.0
    level.cpu_iowait = iowait / total if total else 0.0

    window = Q(finished_at__gte=t0, finished_at__lt=t1)
    done = Export.objects.filter(window).aggregate(
        ok=Count("id", filter=Q(state=ExportState.SUCCEEDED)),
        rows=Sum("row_count", filter=Q(state=ExportState.SUCCEEDED)),
        failed=Count("id", filter=Q(state=ExportState.FAILED)),
    )
    level.exports, level.rows, level.exports_failed = done["ok"], done["rows"] or 0, done["failed"]
    attempts = Attempt.objects.filter(window, job__queue=EXPORTS_QUEUE)
    split = attempts.filter(outcome=Outcome.SUCCEEDED).aggregate(
        n=Count("id"), compute=Sum("compute_seconds"), db=Sum("db_wait_seconds"), storage=Sum("storage_wait_seconds")
    )
    if split["n"]:
        level.split = (split["compute"] / split["n"], split["db"] / split["n"], split["storage"] / split["n"])
        level.split_n = split["n"]
    level.attempts_failed = attempts.exclude(outcome=Outcome.SUCCEEDED).count()
    small = Job.objects.filter(window, queue=SMALL_QUEUE)
    level.small_failed += small.filter(state=JobState.FAILED).count()
    finished = small.filter(state=JobState.SUCCEEDED).values_list("finished_at", "created_at")
    e2e = [(f - c).total_seconds() for f, c in finished if f is not None]  # the window's filter: never None
    level.small_done, level.small_e2e = len(e2e), e2e
    deleted = delete_published(storage, deleted)
    level.runs = [level.per_minute]
    print(
        f"  concurrency {concurrency}: {level.exports} exports ({level.per_minute:.1f}/min), "
        f"{level.small_done} small jobs, {level.failures} failures, CPU {level.cpu_busy:.0%}",
        file=sys.stderr,
    )
    return level


# -- report ------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def p95(traffic: list[float]) -> float:
    return pct(traffic, 0.95) * 1000


def p50(traffic: list[float]) -> float:
    return pct(traffic, 0.50) * 1000


def each(level: Level) -> str:
    return f" ({', '.join(f'{r:,.0f}' for r in level.runs)})" if len(level.runs) > 1 else ""


def table(levels: list[Level]) -> list[str]:
    lines = [
        "| concurrency (workers = budget) | exports/min (each run) | vs first | rows/min | oldest age p50 / max s: exports | "
        "oldest age p50 / max s: default | small job e2e p50 / p95 ms | API p50 / p95 ms | pages p50 / p95 ms | "
        "failures (exports / small / HTTP; failed attempts) | worker RSS per active export MiB (median / max) | "
        "per export s: db wait / compute / storage (db share) | host CPU busy (iowait) | load avg |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first = levels[0].per_minute or float("nan")
    for level in levels:
        ex, small = level.ages[EXPORTS_QUEUE], level.ages[SMALL_QUEUE]
        compute, db, storage = level.split
        busy = compute + db + storage
        rss = level.rss_per_export
        lines.append(
            f"| {level.concurrency} | {level.per_minute:,.1f}{each(level)} | {level.per_minute / first:.2f}x | "
            f"{level.rows * 60 / level.seconds:,.0f} | {pct(ex, 0.5):.1f} / {max(ex, default=0):.1f} | "
            f"{pct(small, 0.5):.2f} / {max(small, default=0):.2f} | "
            f"{p50(level.small_e2e):.0f} / {p95(level.small_e2e):.0f} | "
            f"{p50(level.traffic.api):.1f} / {p95(level.traffic.api):.1f} | "
            f"{p50(level.traffic.pages):.0f} / {p95(level.traffic.pages):.0f} | "
            f"{level.exports_failed} / {level.small_failed} / {level.traffic.failures}; {level.attempts_failed} | "
            f"{(statistics.median(rss) if rss else float('nan')):.0f} / {max(rss, default=float('nan')):.0f} | "
            f"{db:.3f} / {compute:.3f} / {storage:.3f} ({(db / busy if busy else 0):.0%}) | "
            f"{level.cpu_busy:.0%} ({level.cpu_iowait:.0%}) | {level.load:.1f} |"
        )
    return lines


def verdict(levels: list[Level]) -> tuple[str, int]:
    """Where adding concurrency stopped paying, and the budget default that follows."""
    for before, after in itertools.pairwise(levels):
        gain = after.per_minute / before.per_minute - 1 if before.per_minute else float("inf")
        grew = []
        if after.split[1] > before.split[1]:
            grew.append(f"database wait per export {before.split[1]:.3f} -> {after.split[1]:.3f} s")
        for name, was, now in (
            ("API p95", p95(before.traffic.api), p95(after.traffic.api)),
            ("pages p95", p95(before.traffic.pages), p95(after.traffic.pages)),
        ):
            if now > was:
                grew.append(f"{name} {was:.0f} -> {now:.0f} ms")
        if gain < PAYS and grew:
            return (
                f"Adding concurrency stopped paying at {after.concurrency}: exports/min {gain:+.0%} over "
                f"{before.concurrency} (less than {PAYS:.0%}) while {', '.join(grew)}. "
                f"Recommended exports budget default: concurrency_limit={before.concurrency}.",
                before.concurrency,
            )
    last = levels[-1]
    return (
        f"Adding concurrency still paid up to {last.concurrency} (each level at least {PAYS:.0%} more exports/min, "
        f"or no growth in database wait or latency); measure higher levels before going further. "
        f"Recommended exports budget default: concurrency_limit={last.concurrency}.",
        last.concurrency,
    )


def machine_info(args: argparse.Namespace) -> list[str]:
    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (pg_version,) = cursor.fetchone()
    mix = ", ".join(f"{count} x {size:,} rows" for size, count in zip(args.sizes, args.mix, strict=True))
    order = ",".join(map(str, args.levels)) + (" then reversed, alternately" if args.repeat > 1 else "")
    return [
        f"- nproc: {len(os.sched_getaffinity(0))}, {platform.system()} {platform.release()}, "
        f"load average {os.getloadavg()[0]:.2f} at the start",
        f"- Python {platform.python_version()}, Django {django.get_version()}, PostgreSQL {pg_version.split()[0]}",
        f"- per level and run: {args.warmup:g} s warm-up, {args.duration:g} s measured, {args.repeat} run(s), "
        f"order {order}; backlog {args.backlog} queued exports "
        f"(cycle: {mix}); small jobs {args.small_rate:g}/s on queue {SMALL_QUEUE!r} (1 worker); "
        f"HTTP {args.http_rate:g} GET/s to {args.web_workers} uvicorn process(es); 1 koala_beat",
    ]


def main() -> None:
    args = parse_args()
    storage = Path(tempfile.mkdtemp(prefix="koala-bench-capacity-"))
    setup_django(KOALA_EXPORT_ROOT=str(storage))
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    logdir = storage / "logs"
    logdir.mkdir()
    env = {**os.environ, "KOALA_EXPORT_ROOT": str(storage), "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    server: Server | None = None
    finished = False
    try:
        accounts = prepare_data(args.sizes)
        reset(storage)
        cookie, key = credentials()
        print("\n".join(machine_info(args)))
        server = Server(logdir, "web", workers=args.web_workers if args.web_workers > 1 else None)
        ctx = {"accounts": accounts, "budget": exports_budget(), "cookie": cookie, "key": key, "port": server.port}
        # Repetitions alternate the order (1,2,4 then 4,2,1): a load that drifts during the run
        # (a shared host) then weighs on every level alike. Reported in ascending order.
        done: dict[int, list[Level]] = {n: [] for n in args.levels}
        for repetition in range(args.repeat):
            for n in args.levels if repetition % 2 == 0 else args.levels[::-1]:
                done[n].append(run_level(n, args, ctx, storage, logdir, env))
        levels = sorted((pooled(runs) for runs in done.values()), key=lambda level: level.concurrency)
        print(f"- load average {os.getloadavg()[0]:.2f} at the end")
        print()
        print("\n".join(table(levels)))
        print()
        line, _ = verdict(levels)
        print(line)
        dry = [f"{level.concurrency} ({level.dry:.0%} of the looks)" for level in levels if level.dry]
        if dry:
            print(f"\nThe backlog ran dry at concurrency {', '.join(dry)}: raise --backlog for a saturated measurement.")
        problems = sorted({p for level in levels for p in level.traffic.problems})
        if problems:
            print(f"\nHTTP failures: {'; '.join(problems[:10])}")
        finished = True
    finally:
        if server is not None:
            server.stop()
        for folder in ("exports", "tmp"):
            shutil.rmtree(storage / folder, ignore_errors=True)
        if finished:
            shutil.rmtree(storage, ignore_errors=True)
        else:
            print(f"the processes' logs are kept in {logdir}", file=sys.stderr)


if __name__ == "__main__":
    main()
