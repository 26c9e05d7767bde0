"""Worker API benchmark: one uvicorn process serving koala.asgi, HTTP workers as real clients.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.worker_api [--idle-workers 200] [--seconds 20] [--jobs 2000] [--latency-jobs 100]

Not a test: it prints a markdown table (see bench/README.md for the definitions):

1. an idle fleet of long-polling workers (each one open ``acquire`` request with wait 60 s):
   the server's database transactions per second and the server process's CPU seconds per second;
2. wake-up latency, enqueue (commit) to the lease received by the client, with 1 and with N
   waiting workers;
3. end-to-end jobs/s of a threaded HTTP worker at concurrency 8 draining trivial jobs, against
   the RQ runtime (one ``koala_worker`` process) draining the same jobs, in the same run.

DESTRUCTIVE for the databases it is pointed at: it TRUNCATEs Koala's job tables and FLUSHDBs the
Redis db; it refuses a database name without "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
from devtools.servers import uvicorn_command, wait_listening  # noqa: E402

KEY = "koala:bench:koala"  # the incr kind's counter (bench.throughput.koala_verify checks it)
ECHO: dict[str, Any] = {"name": "http.echo", "version": 1}
INCR: dict[str, Any] = {"name": "incr", "version": 1}
HTTP_CONCURRENCY = 8
# pg_stat_database is fed by backends: one that goes idle flushes its counters only after
# PGSTAT_IDLE_INTERVAL (10 s in PostgreSQL 15+). Registering the fleet is a burst of commits; the
# window starts this long after it, so none of that burst is counted in it.
SETTLE_SECONDS = 11.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-workers", type=int, default=200, help="long-polling workers in the idle fleet (default 200)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the idle window (default 20)")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs drained by each runtime (default 2000)")
    parser.add_argument("--latency-jobs", type=int, default=100, help="jobs enqueued one at a time per latency row")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS, help="seconds between fleet start and idle window")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if min(args.idle_workers, args.jobs, args.latency_jobs) < 1 or args.seconds <= 0 or args.settle < 0:
        parser.error("sizes must be positive")
    return args


# -- the server ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One uvicorn process serving koala.asgi, as tests/support/api_server.py starts it."""

    def __init__(self, logdir: Path, name: str, *, workers: int | None = None) -> None:
        self.port = free_port()
        self.log_path = logdir / f"{name}.log"
        env = dict(os.environ)
        env.setdefault("LOG_LEVEL", "WARNING")
        self.proc = subprocess.Popen(
            uvicorn_command(
                host="127.0.0.1",
                port=self.port,
                access_log=False,
                graceful_seconds=2,
                workers=workers,
                extra=("--backlog", "4096"),
            ),
            cwd=ROOT,
            env=env,
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
        )
        if not wait_listening(self.proc, self.port, timeout=60):
            self.stop()
            sys.exit(f"uvicorn did not start; see {self.log_path}")

    def cpu_seconds(self) -> float:
        """CPU seconds of the server: its process and, with --workers, the processes it started."""
        import psutil

        process = psutil.Process(self.proc.pid)
        total = 0.0
        for each in [process, *process.children(recursive=True)]:
            try:
                times = each.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Client:
    """A persistent HTTP/1.1 connection (keep-alive), JSON in and out: one per worker thread."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def post(self, path: str, body: dict[str, Any], sent: threading.Event | None = None) -> tuple[int, Any]:
        """``sent`` is set once the request is on the wire (the caller then waits for its answer)."""
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"}
        payload = json.dumps(body).encode()
        try:
            self.conn.request("POST", path, body=payload, headers=headers)
            if sent is not None:
                sent.set()
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the kept-alive connection while it was idle (uvicorn's keep-alive
            # timeout, 5 s): what every HTTP client library does, once, on a fresh connection.
            self.conn.close()
            self.conn.request("POST", path, body=payload, headers=headers)
            response = self.conn.getresponse()
        data = response.read()
        return response.status, (json.loads(data) if data else None)

    def close(self) -> None:
        try:
            if self.conn.sock is not None:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def register(client: Client, *, name: str, kinds: list[dict[str, Any]], concurrency: int) -> str:
    status, body = client.post("/api/v1/workers/register", {"name": name, "kinds": kinds, "concurrency": concurrency})
    if status != 200:
        raise RuntimeError(f"register {name}: {status} {body}")
    return str(body["worker_id"])


def complete(client: Client, worker_id: str, lease: dict[str, Any], output: Any) -> None:
    body = {"worker_id": worker_id, "lease_token": lease["lease_token"], "output": output}
    status, answer = client.post(f"/api/v1/leases/{lease['lease_id']}/complete", body)
    # 409 already_recorded: a repeat after a lost reply (the retry above) landed; that is success.
    if status != 200 and not (status == 409 and answer and answer.get("error") == "already_recorded"):
        raise RuntimeError(f"complete {lease['lease_id']}: {status} {answer}")


# -- parts 1 and 2: the long-polling fleet ----------------------------------------------------------
class PollingWorker(threading.Thread):
    """register + a loop of acquire(max 1, wait 60); a lease is reported to
    ``received`` at once (the latency's end), then completed."""

    def __init__(self, port: int, key: str, name: str, received: queue.Queue[tuple[float, int]], stop: threading.Event):
        super().__init__(name=name, daemon=True)
        self.client = Client(port, key)
        self.received, self.stop = received, stop
        self.error: str | None = None
        self.waiting = threading.Event()  # its first acquire is on the wire

    def run(self) -> None:
        try:
            worker_id = register(self.client, name=self.name, kinds=[ECHO], concurrency=1)
            path = f"/api/v1/workers/{worker_id}/acquire"
            while not self.stop.is_set():
                status, body = self.client.post(path, {"max": 1, "wait_seconds": 60}, sent=self.waiting)
                if status == 204:
                    continue
                if status != 200:
                    raise RuntimeError(f"acquire: {status} {body}")
                for lease in body["leases"]:
                    self.received.put((time.perf_counter(), int(lease["job_id"])))
                    complete(self.client, worker_id, lease, {"echo": lease["input"]})
        except Exception as exc:  # the server stopped at the end of the part, or a real failure
            if not self.stop.is_set():
                self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.client.close()


class Fleet:
    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.received: queue.Queue[tuple[float, int]] = queue.Queue()
        self.stop = threading.Event()
        self.workers: list[PollingWorker] = []

    def grow(self, to: int) -> None:
        """Register and start workers until ``to`` wait; returns when each has its acquire sent."""
        new = [
            PollingWorker(self.port, self.key, f"bench-idle-{i}", self.received, self.stop) for i in range(len(self.workers), to)
        ]
        for worker in new:
            worker.start()
        for worker in new:
            if not worker.waiting.wait(timeout=60):
                sys.exit(f"{worker.name} did not send its acquire: {worker.error}")
        self.workers += new
        time.sleep(0.5)  # the last requests reach the hub (nothing to wait for from outside)

    def errors(self) -> list[str]:
        return [f"{w.name}: {w.error}" for w in self.workers if w.error]

    def close(self) -> None:
        self.stop.set()
        for worker in self.workers:
            worker.client.close()
        for worker in self.workers:
            worker.join(timeout=10)


class Meter:
    """Transactions of one database (pg_stat_database xact_commit + xact_rollback), read from a
    connection to the ``postgres`` database so that reading adds nothing to the measured one."""

    def __init__(self) -> None:
        from bench.throughput import stats_connection

        self.dbname, self.pg = stats_connection()

    def xacts(self) -> tuple[int, int]:
        """(transactions, sessions opened) so far."""
        self.pg.execute("SELECT pg_stat_clear_snapshot()")
        row = self.pg.execute(
            "SELECT xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = %s", [self.dbname]
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def backends(self) -> int:
        row = self.pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'", [self.dbname]
        ).fetchone()
        return int(row[0]) if row else 0


@dataclass
class Idle:
    workers: int
    seconds: float
    xacts: int
    cpu: float
    backends: int
    sessions: int  # database connections the server opened in the window
    rings: int  # doorbell messages published during the window (by anyone: see count_rings)

    @property
    def qps(self) -> float:
        return self.xacts / self.seconds


class RingCounter(threading.Thread):
    """Counts doorbell messages while it runs. Redis pub/sub channels are per server, not per
    database number: another Koala on the same Redis (any db) rings this server's poller too."""

    def __init__(self) -> None:
        from redis import Redis

        from workers import doorbell

        super().__init__(name="ring-counter", daemon=True)
        self.pubsub = Redis.from_url(os.environ["REDIS_URL"]).pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(doorbell.channel("doorbell"))
        self.pubsub.get_message(timeout=1.0)  # the subscribe confirmation
        self.rings = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            if self.pubsub.get_message(timeout=0.2) is not None:
                self.rings += 1

    def stop(self) -> int:
        self.stopping.set()
        self.join(timeout=5)
        self.pubsub.close()
        return self.rings


def idle_window(server: Server, meter: Meter, fleet: Fleet, seconds: float, settle: float) -> Idle:
    from django.db import connection

    connection.close()  # the bench's own connection to the measured database: none during the window
    time.sleep(settle)
    counter = RingCounter()
    counter.start()
    (x0, s0), c0, t0 = meter.xacts(), server.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    (x1, s1), c1, t1 = meter.xacts(), server.cpu_seconds(), time.monotonic()
    return Idle(len(fleet.workers), t1 - t0, x1 - x0, c1 - c0, meter.backends(), s1 - s0, counter.stop())


def wake_latencies(fleet: Fleet, n: int) -> list[float]:
    """Enqueue ``n`` echo jobs one at a time, each after the previous lease was received:
    seconds from just before ``enqueue()`` (its INSERT and commit included) to the client's receipt."""
    from django.db import connection

    from workers.services.jobs import enqueue

    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        job = enqueue(kind=ECHO["name"], input={"i": i})
        try:
            received, job_id = fleet.received.get(timeout=30)
        except queue.Empty:
            sys.exit(f"no worker received job {job.job_id} within 30 s; errors: {fleet.errors()[:3]}")
        if job_id != job.job_id:
            sys.exit(f"received job {job_id}, expected {job.job_id}")
        samples.append(received - t0)
        time.sleep(0.02)  # the receiving worker completes and asks again (its ask is not measured)
    connection.close()
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# -- part 3: draining --------------------------------------------------------------------------
@dataclass
class Drain:
    runtime: str
    jobs: int
    seconds: float
    cpu: float  # the server's (HTTP) or the worker process's (RQ) CPU seconds while draining
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else math.inf


def enqueue_incr(n: int) -> None:
    from django.db import connection

    from workers.services.jobs import JobSpec, enqueue_many

    enqueue_many(specs=[JobSpec(kind="incr", input={"key": KEY}) for _ in range(n)])
    connection.close()


def http_drain(logdir: Path, key: str, n: int) -> Drain:
    """The Python SDK worker (sdk/python: ``Worker(client, concurrency=8)``), its body the same
    Redis INCR the RQ runtime's runs, draining n jobs against one server process."""
    from redis import Redis

    from bench.throughput import koala_verify, reset

    sdk = str(Path(__file__).resolve().parents[1] / "sdk" / "python" / "src")
    if sdk not in sys.path:
        sys.path.insert(0, sdk)
    from koala_worker import Client as SdkClient
    from koala_worker import Worker

    reset(True)
    server = Server(logdir, "api-drain")
    redis = Redis.from_url(os.environ["REDIS_URL"])
    done = [0]
    lock = threading.Lock()
    finished = threading.Event()

    def incr(ctx: Any, data: dict[str, Any]) -> int:
        value = int(redis.incr(data["key"]))
        with lock:
            done[0] += 1
            if done[0] >= n:
                finished.set()
        return value

    worker = Worker(
        SdkClient(f"http://127.0.0.1:{server.port}", key, timeout=30),
        concurrency=HTTP_CONCURRENCY,
        name="bench-sdk",
        shutdown_deadline=5,
    )
    worker.register(INCR["name"], INCR["version"], incr)
    try:
        enqueue_incr(n)
        serving = threading.Thread(target=worker.serve, daemon=True)
        cpu0, t0 = server.cpu_seconds(), time.perf_counter()
        serving.start()
        finished.wait(timeout=max(300.0, n / 5))
        # The last completions are in flight when the last body returns: wait for the rows.
        deadline = time.monotonic() + 30
        while koala_verify(n) and time.monotonic() < deadline:
            time.sleep(0.02)
        seconds, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
        worker.stop()
        serving.join(timeout=15)
    finally:
        server.stop()
    return Drain(f"SDK worker (koala_worker), concurrency {HTTP_CONCURRENCY}", n, seconds, cpu, koala_verify(n))


def rq_drain(logdir: Path, n: int) -> Drain:
    """One ``koala_worker --worker-class simple --burst`` process, as bench/throughput.py runs it."""
    from bench.throughput import Workers, koala_verify, reset

    reset(True)
    pool = Workers("koala-simple", 1, logdir, None)
    try:
        enqueue_incr(n)
        pool.go()
        (times,) = pool.wait(timeout=max(300.0, n / 5))
    finally:
        pool.kill()
    return Drain("RQ runtime, 1 koala_worker (simple)", n, times["end"] - times["start"], times["cpu"], koala_verify(n))


# -- report ------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def table(idle: Idle, latencies: dict[int, list[float]], http: Drain, rq: Drain) -> list[str]:
    lines = ["| part | measure | value | target | result |", "|---|---|---:|---:|---|"]
    lines.append(
        f"| idle fleet | database transactions/s, {idle.workers} long-polling workers, {idle.seconds:.0f} s "
        f"| {idle.qps:.2f} | <= 2 | {verdict(idle.qps <= 2)} |"
    )
    lines.append(f"| idle fleet | server CPU s/s | {idle.cpu / idle.seconds:.4f} | - | - |")
    lines.append(f"| idle fleet | database connections opened in the window | {idle.sessions} | - | - |")
    lines.append(f"| idle fleet | doorbell rings seen in the window (other Redis clients') | {idle.rings} | - | - |")
    for waiting, samples in latencies.items():
        p50, p95 = percentile(samples, 0.5) * 1000, percentile(samples, 0.95) * 1000
        lines.append(
            f"| wake-up | enqueue -> lease received, {waiting} waiting, p50 / p95 ms ({len(samples)} jobs) "
            f"| {p50:.1f} / {p95:.1f} | p95 <= 50 | {verdict(p95 <= 50)} |"
        )
    for drain in (http, rq):
        flag = " **FAILED VERIFY**" if drain.problems else ""
        lines.append(f"| drain | {drain.runtime}: jobs/s ({drain.jobs:,} jobs){flag} | {drain.rate:,.0f} | - | - |")
    ratio = http.rate / rq.rate if rq.rate else math.inf
    lines.append(f"| drain | HTTP / RQ jobs/s | {ratio:.2f}x | >= 0.8x | {verdict(ratio >= 0.8)} |")
    lines.append(
        f"| drain | CPU ms/job: API server (HTTP) / koala_worker (RQ) | {http.cpu * 1000 / http.jobs:.2f} / "
        f"{rq.cpu * 1000 / rq.jobs:.2f} | - | - |"
    )
    return lines


def main() -> int:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    from django.db import connection

    from api import keys
    from bench.throughput import reset

    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="koala-bench-api-"))
    reset(True)
    _, key = keys.create_key(name="bench worker_api", scopes=["worker"], actor="bench")
    connection.close()
    meter = Meter()

    server = Server(logdir, "api-fleet")
    fleet = Fleet(server.port, key)
    latencies: dict[int, list[float]] = {}
    try:
        fleet.grow(1)
        latencies[1] = wake_latencies(fleet, args.latency_jobs)
        print(f"wake-up, 1 waiting: p95 {percentile(latencies[1], 0.95) * 1000:.1f} ms", file=sys.stderr, flush=True)
        fleet.grow(args.idle_workers)
        idle = idle_window(server, meter, fleet, args.seconds, args.settle)
        print(f"idle: {idle.qps:.2f} transactions/s", file=sys.stderr, flush=True)
        latencies[len(fleet.workers)] = wake_latencies(fleet, args.latency_jobs)
        errors = fleet.errors()
    finally:
        server.stop()  # first: the open long-polls end with it, so the fleet's threads return at once
        fleet.close()
    if errors:
        sys.exit(f"fleet workers failed: {errors[:5]}")
    http = http_drain(logdir, key, args.jobs)
    print(f"HTTP drain: {http.rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    rq = rq_drain(logdir, args.jobs)
    print(f"RQ drain: {rq.rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    reset(True)

    print("## Koala worker API benchmark\n")
    print(
        f"- nproc {len(os.sched_getaffinity(0))}, Python {sys.version.split()[0]}, database {meter.dbname}; "
        f"server: 1 uvicorn process (koala.asgi), {idle.backends} database connections open at the idle window's end"
    )
    print(f"- command: {' '.join([Path(sys.executable).name, *sys.argv])}  (total {time.monotonic() - started:.0f}s)")
    print(
        "- queries/s = xact_commit + xact_rollback delta of the database in pg_stat_database (pg_stat_statements "
        "is not loaded here; each autocommit statement is one transaction), read from the postgres database, so "
        "the bench's own reads add nothing; the bench holds no connection to the measured database in the window"
    )
    print()
    print("\n".join(table(idle, latencies, http, rq)))
    print()
    problems = [f"{d.runtime}: {p}" for d in (http, rq) for p in d.problems]
    if problems:
        print("VERIFICATION FAILED:\n" + "\n".join(f"- {p}" for p in problems))
        return 1
    print("Verified: both drains left every job succeeded with exactly one attempt and the Redis counter == jobs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
