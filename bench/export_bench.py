"""Export benchmark: the export job against a plain COPY of the same query, same machine, same run.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.export_bench [--sizes 100000,1000000,3000000] [--repeat 1] [--approaches]

Not a test: it prints machine information and markdown tables on stdout (bench/README.md
explains the columns). For each size it exports one account holding exactly that many events:

- **plain COPY**: a bare Python process (psycopg only, no Django) runs
  ``COPY (SELECT …) TO STDOUT`` and writes every chunk to a file: the physical baseline;
- **psql \\copy**: the same through libpq's own C client, when ``psql`` is installed;
- **export**: a real ``koala_worker --queues exports`` process (started fresh for each size)
  runs the export job; its time is the attempt's, from claim to recorded completion
  (streaming, hashing, fsync, the ledger's publish, the fenced completion). Its peak RSS is
  the worker's VmHWM after the export. The export's checksum must equal the baseline file's.
- **request → published**: what a person waits, from just before ``request_export()`` to the
  export's recorded success (its ``finished_at``, written by the fenced completion): the
  request's transaction, the doorbell and the claim, the attempt up to the export row's write.
  Its ratio to **psql \\copy** of the same query, in the same run, is the exports target.

``--approaches`` also compares ways of streaming the same rows in this process (docs/exports.md).

It creates the demo accounts bench-100k/bench-1m/bench-3m (reused when they already hold
exactly that many events) and writes into a temporary folder. It refuses a PostgreSQL database
whose name lacks "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above

YEAR = (date(2026, 1, 1), date(2026, 12, 31))
MIB = 1024 * 1024
WARMUP_ROWS = 1_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000,3000000", help="rows per export, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size; the table shows medians")
    parser.add_argument("--batch-rows", type=int, default=None, help="KOALA_EXPORT_BATCH_ROWS for the worker")
    parser.add_argument("--approaches", action="store_true", help="also compare streaming approaches in this process")
    parser.add_argument("--approach-rows", type=int, default=1_000_000, help="rows for --approaches (one of --sizes)")
    parser.add_argument("--storage", default=None, help="folder for the outputs (default: a temporary folder, removed)")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    parser.add_argument("--baseline-child", nargs=2, metavar=("SQL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < 1 or args.repeat < 1:
        parser.error("--sizes and --repeat must be positive")
    return args


# -- the plain-COPY baseline (a child process: psycopg, no Django) -----------------------------
def baseline_child(sql: str, out: str) -> None:
    import psycopg

    conn = psycopg.connect(os.environ["BENCH_CONNINFO"], autocommit=True)
    started = time.perf_counter()
    size = 0
    with conn.cursor() as cursor, cursor.copy(sql) as copy, open(out, "wb") as handle:
        for data in copy:
            handle.write(data)
            size += len(data)
    seconds = time.perf_counter() - started
    conn.close()
    print(json.dumps({"seconds": seconds, "bytes": size}))


# -- set-up ------------------------------------------------------------------------------------
def conninfo() -> tuple[str, dict[str, str]]:
    """libpq connection string for child processes, with the password in the environment."""
    from django.db import connection
    from psycopg.conninfo import make_conninfo

    params = connection.settings_dict
    info = make_conninfo(
        dbname=params["NAME"], user=params.get("USER") or None, host=params.get("HOST") or None, port=params.get("PORT") or None
    )
    env = {"PGOPTIONS": "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601"}
    if params.get("PASSWORD"):
        env["PGPASSWORD"] = params["PASSWORD"]
    return info, env


def prepare_data(sizes: list[int]) -> dict[int, Any]:
    """One account per size holding exactly that many events (made once, then reused)."""
    from django.contrib.auth.models import User
    from django.db.models import Count

    from exports.demo_data import generate_events
    from exports.models import Account, Event

    User.objects.get_or_create(username="bench", defaults={"is_superuser": True, "is_staff": True})
    accounts = {}
    for size in sizes:
        account, _ = Account.objects.get_or_create(slug=f"bench-{size}", defaults={"name": f"Bench {size:,} rows"})
        have = Event.objects.filter(account=account).aggregate(n=Count("id"))["n"]
        if have != size:
            Event.objects.filter(account=account).delete()
            made = generate_events(rows=size, accounts=[account], seed=size)
            print(f"generated {size:,} events for {account.slug} in {made.seconds:.1f} s ({made.rows_per_second:,.0f} rows/s)")
        accounts[size] = account
    return accounts


def literal_select(account_id: int) -> str:
    """The export's SELECT with its values inlined, for COPY and psql's \\copy."""
    import psycopg

    from exports.sql import select_sql
    from exports.streaming import connection_params

    select, params = select_sql(account_id=account_id, date_from=YEAR[0], date_to=YEAR[1])
    with psycopg.connect(**connection_params()) as conn, psycopg.ClientCursor(conn) as cursor:
        return cursor.mogrify(select, params)


# -- one measurement of each kind ------------------------------------------------------------
@dataclass
class Run:
    seconds: float
    size: int
    rows: int = 0
    rss_peak: int = 0  # bytes (VmHWM)
    rss_idle: int = 0
    split: tuple[float, float, float] = (0.0, 0.0, 0.0)
    sha256: str = ""
    requested: float = 0.0  # request → published, seconds
    claimed: float = 0.0  # request → claim (the attempt's start), seconds
    request_call: float = 0.0  # request_export() itself (its transaction and the doorbell), seconds


def sha256_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(MIB):
            hasher.update(chunk)
    return hasher.hexdigest()


def run_baseline(select: str, out: Path) -> Run:
    """Plain COPY of the export's select with its values inlined (literal_select): the baseline is
    PostgreSQL's own CSV writer, so it takes the text as the export would send it, not a SQL home's
    statement (exports.sql.copy_sql wraps only those)."""
    info, env = conninfo()
    copy = f"COPY ({select}) TO STDOUT WITH (FORMAT csv, HEADER)"
    done = subprocess.run(
        [sys.executable, "-m", "bench.export_bench", "--baseline-child", copy, str(out)],
        cwd=ROOT,
        env={**os.environ, **env, "BENCH_CONNINFO": info},
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout)
    run = Run(seconds=result["seconds"], size=result["bytes"], sha256=sha256_file(out))
    out.unlink()
    return run


def run_psql(select: str, out: Path) -> Run | None:
    psql = shutil.which("psql")
    if psql is None:
        return None
    info, env = conninfo()
    started = time.perf_counter()
    subprocess.run(
        [psql, info, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", f"\\copy ({select}) TO '{out}' WITH (FORMAT csv, HEADER)"],
        env={**os.environ, **env},
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - started
    run = Run(seconds=seconds, size=out.stat().st_size, sha256=sha256_file(out))
    out.unlink()
    return run


def vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def start_worker(storage: Path, batch_rows: int | None, logdir: Path, name: str) -> subprocess.Popen[bytes]:
    from workers.models import WorkerProcess

    env = {**os.environ, "KOALA_EXPORT_ROOT": str(storage), "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
    if batch_rows:
        env["KOALA_EXPORT_BATCH_ROWS"] = str(batch_rows)
    log = open(logdir / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "koala_worker", "--queues", "exports", "--name", name],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not WorkerProcess.objects.filter(name=name, pid=proc.pid, stopped_at__isnull=True).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"the export worker did not start; see {logdir / (name + '.log')}")
        time.sleep(0.1)
    time.sleep(0.5)  # from registered to listening
    return proc


def export_once(account: Any) -> tuple[Any, datetime, float]:
    """Request an export of the account's year and wait until it ends: the export, when it was
    requested and how long request_export() took."""
    from django.contrib.auth.models import User

    from exports.models import ExportState
    from exports.services import request_export

    user = User.objects.get(username="bench")
    requested_at = datetime.now(UTC)  # the worker's timestamps come from the same host clock
    export = request_export(user=user, account_id=account.pk, date_from=YEAR[0], date_to=YEAR[1])
    request_call = (datetime.now(UTC) - requested_at).total_seconds()
    deadline = time.monotonic() + 600
    while not export.is_terminal and time.monotonic() < deadline:
        time.sleep(0.05)
        export.refresh_from_db()
    if export.state != ExportState.SUCCEEDED:
        sys.exit(f"export {export.pk} ended {export.state}: {export.failure_code} {export.error_message}")
    return export, requested_at, request_call


def run_export(account: Any, warmup: Any, storage: Path, batch_rows: int | None, logdir: Path, n: int) -> Run:
    from workers.models import Attempt

    proc = start_worker(storage, batch_rows, logdir, name=f"bench-export-{os.getpid()}-{n}")
    try:
        # A long-lived worker has run exports before: pay the first-use costs (ORM query
        # compilation, adapters) outside the measurement, with a 1,000-row export.
        (storage / export_once(warmup)[0].output_key).unlink()
        idle = vm_hwm(proc.pid)
        export, requested_at, request_call = export_once(account)
        peak = vm_hwm(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    attempt = Attempt.objects.filter(job_id=export.job_id, outcome="succeeded").get()
    assert attempt.finished_at is not None
    seconds = (attempt.finished_at - attempt.started_at).total_seconds()
    assert export.finished_at is not None
    (storage / export.output_key).unlink()  # the record stays; the disk does not fill up
    return Run(
        seconds=seconds,
        size=export.bytes or 0,
        rows=export.row_count or 0,
        rss_peak=peak,
        rss_idle=idle,
        split=(export.compute_seconds or 0.0, export.db_wait_seconds or 0.0, export.storage_wait_seconds or 0.0),
        sha256=export.checksum,
        requested=(export.finished_at - requested_at).total_seconds(),
        claimed=(attempt.started_at - requested_at).total_seconds(),
        request_call=request_call,
    )


# -- streaming approaches, in this process ---------------------------------------------------------
class Timer:
    def __init__(self) -> None:
        self.waits = {"db": 0.0, "storage": 0.0}

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.waits[what] += time.perf_counter() - started


def approach_lowlevel_copy(account_id: int, out: Path, batch: int) -> int:
    """exports.streaming.CopyReader: one COPY, each libpq row appended to the batch's bytearray (what the job uses)."""
    from exports.sql import copy_sql, select_sql
    from exports.streaming import CopyReader

    select, params = select_sql(account_id=account_id, date_from=YEAR[0], date_to=YEAR[1])
    rows = 0
    hasher = hashlib.sha256()
    with CopyReader(statement=copy_sql(select), params=params, batch_rows=batch, waiting=Timer().waiting) as reader:
        with open(out, "wb") as handle:
            for chunk in reader.batches():
                hasher.update(chunk.data)
                handle.write(chunk.data)
                rows += chunk.rows
    return rows


def approach_row_views(account_id: int, out: Path, batch: int) -> int:
    """The same libpq loop as exports.streaming had it before: each row's memoryview kept in a list,
    joined per batch, the collector paused (the views are GC-tracked objects)."""
    import select as select_module

    import psycopg
    from psycopg import pq

    from exports.sql import copy_sql, select_sql
    from exports.streaming import connection_params

    select, params = select_sql(account_id=account_id, date_from=YEAR[0], date_to=YEAR[1])
    rows = -1  # the header line
    hasher = hashlib.sha256()
    with psycopg.connect(**connection_params(), autocommit=True) as conn, open(out, "wb") as handle:
        with psycopg.ClientCursor(conn) as cursor:
            query = cursor.mogrify(copy_sql(select), params)
        pgconn = conn.pgconn
        pgconn.nonblocking = 1
        pgconn.send_query(query.encode())
        while pgconn.flush():
            select_module.select([], [pgconn.socket], [])
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            select_module.select([pgconn.socket], [], [])
        result = pgconn.get_result()
        assert result is not None and result.status == pq.ExecStatus.COPY_OUT
        buffer: list[memoryview] = []
        gc.disable()
        try:
            while True:
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes > 0:
                    buffer.append(data)
                    if len(buffer) >= batch:
                        chunk = b"".join(buffer)
                        hasher.update(chunk)
                        handle.write(chunk)
                        rows += len(buffer)
                        buffer.clear()
                    continue
                if nbytes == 0:
                    select_module.select([pgconn.socket], [], [])
                    pgconn.consume_input()
                    continue
                break
        finally:
            gc.enable()
        chunk = b"".join(buffer)
        hasher.update(chunk)
        handle.write(chunk)
        rows += len(buffer)
        while pgconn.get_result() is not None:
            pass
        pgconn.nonblocking = 0
    return rows


def _psycopg_copy(account_id: int, out: Path, batch: int, *, pause_collector: bool) -> int:
    import psycopg

    from exports.sql import copy_sql, select_sql
    from exports.streaming import connection_params

    select, params = select_sql(account_id=account_id, date_from=YEAR[0], date_to=YEAR[1])
    rows = -1  # the header line
    hasher = hashlib.sha256()
    if pause_collector:
        gc.disable()
    try:
        with psycopg.connect(**connection_params(), autocommit=True) as conn, conn.cursor() as cursor:
            with cursor.copy(copy_sql(select), params) as copy, open(out, "wb") as handle:
                buffer: list[Any] = []
                for data in copy:
                    buffer.append(data)
                    if len(buffer) >= batch:
                        chunk = b"".join(buffer)
                        hasher.update(chunk)
                        handle.write(chunk)
                        rows += len(buffer)
                        buffer.clear()
                chunk = b"".join(buffer)
                hasher.update(chunk)
                handle.write(chunk)
                rows += len(buffer)
    finally:
        gc.enable()
    return rows


def approach_psycopg_copy(account_id: int, out: Path, batch: int) -> int:
    """psycopg's Copy iterator (cursor.copy()), batches of rows; the collector on."""
    return _psycopg_copy(account_id, out, batch, pause_collector=False)


def approach_psycopg_copy_nogc(account_id: int, out: Path, batch: int) -> int:
    """The same with the collector paused."""
    return _psycopg_copy(account_id, out, batch, pause_collector=True)


def approach_keyset_copy(account_id: int, out: Path, batch: int) -> int:
    """A keyset-bounded COPY per batch: find the batch's last (occurred_at, id), COPY up to it."""
    import psycopg

    from exports.sql import COLUMNS, window
    from exports.streaming import CopyReader, connection_params

    start, end = window(date_from=YEAR[0], date_to=YEAR[1])
    base = "FROM exports_event WHERE account_id = %(a)s AND occurred_at >= %(s)s AND occurred_at < %(e)s"
    rows = 0
    last: tuple[Any, Any] | None = None
    timer = Timer()
    with psycopg.connect(**connection_params(), autocommit=True) as conn, open(out, "wb") as handle:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")  # one snapshot, as one COPY has
        while True:
            after = " AND (occurred_at, id) > (%(lt)s, %(li)s)" if last else ""
            params: dict[str, Any] = {"a": account_id, "s": start, "e": end, "n": batch - 1}
            if last:
                params.update(lt=last[0], li=last[1])
            upper = conn.execute(
                f"SELECT occurred_at, id {base}{after} ORDER BY occurred_at, id OFFSET %(n)s LIMIT 1", params
            ).fetchone()
            until = ""
            if upper:
                until = " AND (occurred_at, id) <= (%(ut)s, %(ui)s)"
                params.update(ut=upper[0], ui=upper[1])
            header = last is None
            statement = (
                f"COPY (SELECT {COLUMNS} {base}{after}{until} ORDER BY occurred_at, id) "
                f"TO STDOUT WITH (FORMAT csv{', HEADER' if header else ''})"
            )
            with CopyReader(
                statement=statement, params=params, batch_rows=batch, waiting=timer.waiting, header=header, connection=conn
            ) as reader:
                for chunk in reader.batches():
                    handle.write(chunk.data)
                    rows += chunk.rows
            if upper is None:
                break
            last = upper
        conn.execute("COMMIT")
    return rows


def approach_cursor_csv(account_id: int, out: Path, batch: int) -> int:
    """A server-side cursor fetching batches of rows; Python's csv module writes them."""
    import psycopg

    from exports.sql import COLUMNS, select_sql
    from exports.streaming import connection_params

    select, params = select_sql(account_id=account_id, date_from=YEAR[0], date_to=YEAR[1])
    rows = 0
    with psycopg.connect(**connection_params()) as conn, conn.cursor(name="bench_export") as cursor:
        cursor.execute(select, params)
        with open(out, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS.split(", "))
            while batch_rows := cursor.fetchmany(batch):
                writer.writerows(batch_rows)
                rows += len(batch_rows)
    return rows


def approach_keyset_select_csv(account_id: int, out: Path, batch: int) -> int:
    """Keyset-paginated SELECTs (WHERE (occurred_at, id) > last LIMIT n); the csv module writes them."""
    import psycopg

    from exports.sql import COLUMNS, window
    from exports.streaming import connection_params

    start, end = window(date_from=YEAR[0], date_to=YEAR[1])
    rows = 0
    last = None
    with psycopg.connect(**connection_params()) as conn, open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS.split(", "))
        while True:
            after = "AND (occurred_at, id) > (%(lt)s, %(li)s)" if last else ""
            found = conn.execute(
                f"SELECT {COLUMNS} FROM exports_event WHERE account_id = %(a)s AND occurred_at >= %(s)s "
                f"AND occurred_at < %(e)s {after} ORDER BY occurred_at, id LIMIT %(n)s",
                {
                    "a": account_id,
                    "s": start,
                    "e": end,
                    "n": batch,
                    "lt": last[1] if last else None,
                    "li": last[0] if last else None,
                },
            ).fetchall()
            if not found:
                break
            writer.writerows(found)
            rows += len(found)
            last = found[-1]
    return rows


APPROACHES: list[tuple[str, Callable[[int, Path, int], int], bool]] = [
    ("single COPY, libpq rows into a bytearray (exports.streaming; kept)", approach_lowlevel_copy, True),
    ("single COPY, libpq row views joined per batch (before)", approach_row_views, True),
    ("single COPY, psycopg cursor.copy() iterator", approach_psycopg_copy, True),
    ("single COPY, cursor.copy(), collector paused", approach_psycopg_copy_nogc, True),
    ("keyset-bounded COPY per batch (libpq rows)", approach_keyset_copy, True),
    ("server-side cursor + csv module", approach_cursor_csv, False),
    ("keyset SELECT batches + csv module", approach_keyset_select_csv, False),
]


def compare_approaches(account: Any, rows: int, storage: Path, batch: int, repeat: int, reference: str) -> list[str]:
    lines = [
        f"### Streaming approaches: {rows:,} rows, batches of {batch:,}, one process with Django loaded (median of {repeat})",
        "",
        "| approach | seconds | rows/s | MB/s | client CPU s | same bytes as COPY |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, function, byte_identical in APPROACHES:
        times, cpus = [], []
        out = storage / "approach.csv"
        got = 0
        digest = ""
        for _ in range(repeat):
            started, cpu = time.perf_counter(), time.process_time()
            got = function(account.pk, out, batch)
            times.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            size = out.stat().st_size
            digest = sha256_file(out)
            out.unlink()
        seconds = statistics.median(times)
        same = (
            "yes" if digest == reference else ("no (Python formats values differently)" if not byte_identical else "NO: MISMATCH")
        )
        rate = f"{got / seconds:,.0f} | {size / 1e6 / seconds:.1f}"
        lines.append(f"| {label} | {seconds:.2f} | {rate} | {statistics.median(cpus):.2f} | {same} |")
    return lines


# -- report ---------------------------------------------------------------------------------------
def machine_info() -> list[str]:
    import django
    import psycopg
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (pg_version,) = cursor.fetchone()
        cursor.execute(
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings "
            "WHERE name IN ('fsync', 'shared_buffers', 'synchronous_commit')"
        )
        (pg_settings,) = cursor.fetchone()
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    return [
        f"- nproc: {len(os.sched_getaffinity(0))} ({cpu}), {platform.system()} {platform.release()}, "
        f"load average {os.getloadavg()[0]:.2f} at the start",
        f"- Python {platform.python_version()}, Django {django.get_version()}, psycopg {psycopg.__version__} "
        f"(libpq {psycopg.pq.version()}, {psycopg.pq.__impl__})",
        f"- PostgreSQL {pg_version} ({pg_settings}), same host, TCP loopback",
        f"- KOALA_EXPORT_BATCH_ROWS={settings.KOALA_EXPORT_BATCH_ROWS}; output on {storage_fs()}",
    ]


def storage_fs() -> str:
    from django.conf import settings

    out = subprocess.run(["df", "-T", str(settings.KOALA_EXPORT_ROOT)], capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    return lines[-1].split()[1] if len(lines) > 1 else "?"


def main() -> None:
    args = parse_args()
    if args.baseline_child:
        baseline_child(*args.baseline_child)
        return
    own_storage = args.storage is None
    storage = Path(args.storage or tempfile.mkdtemp(prefix="koala-bench-exports-"))
    storage.mkdir(parents=True, exist_ok=True)
    setup_django(KOALA_EXPORT_ROOT=str(storage))
    guard(force=args.force, database_action="write demo data", redis_action="use")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if args.batch_rows:
        from django.conf import settings

        settings.KOALA_EXPORT_BATCH_ROWS = args.batch_rows
    logdir = storage / "logs"
    logdir.mkdir(exist_ok=True)
    try:
        accounts = prepare_data(sorted(set(args.sizes) | ({args.approach_rows} if args.approaches else set()) | {WARMUP_ROWS}))
        print("\n".join(machine_info()))
        print()
        results: dict[int, dict[str, list[Run]]] = {}
        references: dict[int, str] = {}
        for size in args.sizes:
            select = literal_select(accounts[size].pk)
            runs: dict[str, list[Run]] = {"copy": [], "psql": [], "export": []}
            for n in range(args.repeat):
                runs["copy"].append(run_baseline(select, storage / "baseline.csv"))
                psql = run_psql(select, storage / "psql.csv")
                if psql is not None:
                    runs["psql"].append(psql)
                runs["export"].append(run_export(accounts[size], accounts[WARMUP_ROWS], storage, args.batch_rows, logdir, n))
                print(
                    f"  {size:>9,} rows, run {n + 1}: copy {runs['copy'][-1].seconds:.2f}s"
                    + (f", psql {psql.seconds:.2f}s" if psql else "")
                    + f", export {runs['export'][-1].seconds:.2f}s"
                    + f", request → published {runs['export'][-1].requested:.3f}s",
                    file=sys.stderr,
                )
            digests = {r.sha256 for kind in runs.values() for r in kind}
            if len(digests) != 1:
                sys.exit(f"{size} rows: the export and the baselines differ ({digests})")
            references[size] = digests.pop()
            results[size] = runs
        print(table(results))
        if args.approaches:
            from django.conf import settings

            rows = args.approach_rows
            print()
            print(
                "\n".join(
                    compare_approaches(
                        accounts[rows], rows, storage, settings.KOALA_EXPORT_BATCH_ROWS, args.repeat, references.get(rows, "")
                    )
                )
            )
    finally:
        if own_storage:
            shutil.rmtree(storage, ignore_errors=True)


def table(results: dict[int, dict[str, list[Run]]]) -> str:
    has_psql = any(r["psql"] for r in results.values())
    head = "| rows | MB | plain COPY s | COPY rows/s | COPY MB/s |"
    rule = "|---:|---:|---:|---:|---:|"
    if has_psql:
        head += " psql \\copy s |"
        rule += "---:|"
    head += " export s | export rows/s | export MB/s | export / COPY | compute / db / storage s |"
    head += " worker peak RSS MiB | RSS growth vs first MiB |"
    rule += "---:|---:|---:|---:|---|---:|---:|"
    # What a person waits, against what psql \copy of the same query takes in the same run.
    head += " request → published s (min-max) | request → claim ms | of which request_export() ms |"
    rule += "---:|---:|---:|"
    if has_psql:
        head += " psql \\copy / request → published |"
        rule += "---:|"
    lines = [head, rule]
    first_peak: float | None = None
    for size, runs in results.items():
        copy = statistics.median(r.seconds for r in runs["copy"])
        export = statistics.median(r.seconds for r in runs["export"])
        mb = runs["export"][0].size / 1e6
        peak = statistics.median(r.rss_peak for r in runs["export"]) / MIB
        first_peak = peak if first_peak is None else first_peak
        split = [statistics.median(r.split[i] for r in runs["export"]) for i in range(3)]
        row = f"| {size:,} | {mb:,.1f} | {copy:.2f} | {size / copy:,.0f} | {mb / copy:.1f} |"
        if has_psql:
            row += f" {statistics.median(r.seconds for r in runs['psql']):.2f} |" if runs["psql"] else " - |"
        row += (
            f" {export:.2f} | {size / export:,.0f} | {mb / export:.1f} | {copy / export:.0%} |"
            f" {split[0]:.2f} / {split[1]:.2f} / {split[2]:.2f} | {peak:.1f} | {peak - first_peak:+.1f} |"
        )
        requested = [r.requested for r in runs["export"]]
        published = statistics.median(requested)
        row += f" {published:.3f} ({min(requested):.3f}-{max(requested):.3f}) |"
        row += f" {statistics.median(r.claimed for r in runs['export']) * 1000:.1f} |"
        row += f" {statistics.median(r.request_call for r in runs['export']) * 1000:.1f} |"
        if has_psql:
            psql = statistics.median(r.seconds for r in runs["psql"]) if runs["psql"] else None
            row += f" {psql / published:.2f}x |" if psql else " - |"
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
