"""Koala against its peers in one run: Celery, Procrastinate, raw RQ and the raw PostgreSQL floor.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.compare [--jobs 5000] [--workers 2] [--repeat 3] [--modes sequential,live]

Not a test: it prints machine information and one markdown table on stdout and writes the runs
as JSON under bench/results/ (bench/README.md, "Koala against its peers", says what each row and
column means). Every system runs the same body, a Redis ``INCR``, with ``--workers`` worker
processes. Celery and Procrastinate run in their own virtualenv (.venv-peers, built by
``make bench-peers``): their drivers (bench/peers/) are subprocesses of that venv's python; when
it is missing, their rows are left out and the output says so.

DESTRUCTIVE for the databases it is pointed at, like bench/throughput.py (same guard, --force).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import throughput  # noqa: E402 - after the path set-up above
from bench.peers import pg_floor, procrastinate_driver  # noqa: E402
from bench.setup import guard, setup_django  # noqa: E402

PEERS_VENV = ROOT / ".venv-peers"
HOW_TO_GET_PEERS = "build their environment with `make bench-peers` (or scripts/bootstrap-peers, then rerun)"
MODES = ("sequential", "live")
CELERY = "celery"
RQ = "rq-simple"


# -- processes ---------------------------------------------------------------------------------
class Procs:
    """Pre-started processes speaking the line protocol of bench/peers/_protocol.py (``ready``,
    ``go``, ``waiting``, a JSON line); bench/_worker.py speaks the same first lines."""

    def __init__(self, label: str, commands: list[list[str]], env: dict[str, str], logdir: Path) -> None:
        self.label = label
        self.logs = [logdir / f"{label}-{i}.log" for i in range(len(commands))]
        self.procs = [
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=open(log, "ab"),
                text=True,
            )
            for command, log in zip(commands, self.logs, strict=True)
        ]
        self.expect("ready", timeout=90)

    def _readline(self, proc: subprocess.Popen[str], timeout: float) -> str:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        return proc.stdout.readline() if ready else ""

    def expect(self, word: str, timeout: float) -> None:
        for proc in self.procs:
            line = self._readline(proc, timeout)
            if line.strip() != word:
                self.stop()
                raise RuntimeError(f"{self.label}: expected {word!r}, got {line!r}; logs: {', '.join(map(str, self.logs))}")

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def read_json(self, timeout: float) -> list[dict[str, Any]]:
        out = []
        for proc in self.procs:
            line = self._readline(proc, timeout)
            if not line:
                self.stop()
                raise RuntimeError(f"{self.label}: no result within {timeout:.0f}s; logs: {', '.join(map(str, self.logs))}")
            out.append(json.loads(line))
        return out

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM (every system's graceful stop), then SIGKILL after ``grace`` seconds."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def driver(python: str, module: str, role: str, *args: str) -> list[str]:
    return [python, "-m", f"bench.peers.{module}", role, *args]


def run_role(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- systems -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class System:
    key: str  # for --variants
    name: str
    family: str  # koala, rq, celery, procrastinate, floor
    counter_key: str
    workers: Callable[[int, bool], list[str]]  # (index, live) -> the worker's command
    enqueue: Callable[[int], None] | None = None  # in this process (Koala, RQ)
    enqueuer: Callable[[int], list[str]] | None = None  # a pre-started subprocess (the peers)
    unfinished_sql: str | None = None  # durable rows not finished yet, polled once the counter reaches N
    reset: Callable[[], None] | None = None  # beyond FLUSHDB + TRUNCATE
    drop: Callable[[], None] | None = None  # after the last run: what reset created
    verify: Callable[[int], list[str]] = field(default=lambda n: [])
    peer: bool = False  # needs .venv-peers
    driver_env: bool = False  # its processes get peer_env() (DATABASE_URL as a libpq conninfo), not Koala's


def koala_worker(worker_class: str) -> Callable[[int, bool], list[str]]:
    return lambda index, live: (
        [sys.executable, "-m", "bench._worker", f"koala-{worker_class}", throughput.RQ_QUEUE] + (["forever"] if live else [])
    )


def rq_worker(index: int, live: bool) -> list[str]:
    return [sys.executable, "-m", "bench._worker", "rq-simple", throughput.RQ_QUEUE] + (["forever"] if live else [])


def systems(peers_python: str, env: dict[str, str]) -> dict[str, System]:
    def peer_verify(module: str, python: str, key: str) -> Callable[[int], list[str]]:
        return lambda n: list(run_role(driver(python, module, "verify", "--jobs", str(n), "--key", key), env)["problems"])

    def peer_reset(module: str, python: str, key: str, role: str) -> Callable[[], None]:
        return lambda: run_role(driver(python, module, role, "--key", key), env) and None

    def peer(module: str, python: str, key: str, queue: str) -> dict[str, Any]:
        return {
            "counter_key": key,
            "workers": lambda index, live: driver(
                python, module, "worker", "--key", key, "--queue", queue, "--index", str(index)
            ),
            "enqueuer": lambda n: driver(python, module, "enqueue", "--jobs", str(n), "--key", key, "--queue", queue),
            "reset": peer_reset(module, python, key, "reset"),
            "drop": peer_reset(module, python, key, "drop"),
            "verify": peer_verify(module, python, key),
            "driver_env": True,
        }

    koala_unfinished = "SELECT count(*) FROM workers_job WHERE state <> 'succeeded'"
    found = [
        System(CELERY, "Celery solo", "celery", peer=True, **peer("celery_driver", peers_python, "koala:bench:celery", "bench")),
        System(
            "procrastinate",
            "Procrastinate",
            "procrastinate",
            peer=True,
            unfinished_sql=f"SELECT count(*) FROM {procrastinate_driver.SCHEMA}.procrastinate_jobs WHERE status <> 'succeeded'",
            **peer("procrastinate_driver", peers_python, "koala:bench:procrastinate", "bench"),
        ),
        System(RQ, "rq SimpleWorker", "rq", throughput.RQ_KEY, rq_worker, throughput.rq_enqueue, verify=throughput.rq_verify),
        System(
            "koala-simple",
            "koala simple, enqueue()",
            "koala",
            throughput.KOALA_KEY,
            koala_worker("simple"),
            throughput.koala_enqueue_one_by_one,
            unfinished_sql=koala_unfinished,
            verify=throughput.koala_verify,
        ),
        System(
            "koala-simple-many",
            "koala simple, enqueue_many()",
            "koala",
            throughput.KOALA_KEY,
            koala_worker("simple"),
            throughput.koala_enqueue_many,
            unfinished_sql=koala_unfinished,
            verify=throughput.koala_verify,
        ),
        System(
            "koala-fork",
            "koala fork, enqueue()",
            "koala",
            throughput.KOALA_KEY,
            koala_worker("fork"),
            throughput.koala_enqueue_one_by_one,
            unfinished_sql=koala_unfinished,
            verify=throughput.koala_verify,
        ),
        System(
            "pg-floor",
            "raw PostgreSQL claim loop, 1 row/txn",
            "floor",
            unfinished_sql=f"SELECT count(*) FROM {pg_floor.SCHEMA}.job WHERE state <> 'succeeded'",
            # psycopg and redis only: Koala's own interpreter runs it, with or without .venv-peers.
            **peer("pg_floor", sys.executable, "koala:bench:floor", "bench"),
        ),
    ]
    return {s.key: s for s in found}


DEFAULT_VARIANTS = ["celery", "procrastinate", "rq-simple", "koala-simple", "koala-simple-many", "koala-fork", "pg-floor"]


def peers_status(python: str) -> tuple[bool, str]:
    """(usable, versions or the reason it is not) for the peers' interpreter."""
    if not Path(python).exists():
        return False, f"{python} does not exist"
    probe = "import celery, procrastinate; print(f'Celery {celery.__version__}, Procrastinate {procrastinate.__version__}')"
    done = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        return False, f"{python} cannot import celery and procrastinate: {done.stderr.strip().splitlines()[-1:]}"
    return True, done.stdout.strip()


def peer_env() -> dict[str, str]:
    """The drivers' environment: DATABASE_URL as a libpq conninfo built from Django's settings
    (whatever form the URL had: socket, TCP, password), REDIS_URL as is."""
    from django.db import connection
    from psycopg.conninfo import make_conninfo

    params = connection.settings_dict
    conninfo = make_conninfo(
        dbname=params["NAME"],
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=params.get("HOST") or None,
        port=str(params.get("PORT") or "") or None,
    )
    env = dict(os.environ)
    env.update(
        DATABASE_URL=conninfo,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        LOG_LEVEL=env.get("LOG_LEVEL", "WARNING"),
    )
    return env


# -- one run -------------------------------------------------------------------------------------
@dataclass
class Run:
    system: str
    mode: str
    repetition: int
    jobs: int
    enqueue_s: float
    drain_s: float | None  # sequential only
    e2e_s: float
    problems: list[str]


def wait_done(system: System, n: int, redis: Any, timeout: float) -> float:
    """When the last job was done: the counter reached ``n`` (the body ran for every job), then,
    for the systems that keep a row per job, no row is left unfinished (its completion committed)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while int(redis.get(system.counter_key) or 0) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{system.name}: counter {int(redis.get(system.counter_key) or 0)} < {n} after {timeout:.0f}s")
        time.sleep(0.002)
    if system.unfinished_sql:
        with connection.cursor() as cursor:
            while True:
                cursor.execute(system.unfinished_sql)
                if cursor.fetchone()[0] == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{system.name}: rows still unfinished after {timeout:.0f}s")
                time.sleep(0.002)
    return time.time()


def run_once(
    system: System, mode: str, n: int, workers: int, env: dict[str, str], logdir: Path, repetition: int, warmup: float
) -> Run:
    from django.db import connection
    from redis import Redis

    throughput.reset(True)
    if system.reset:
        system.reset()
    redis = Redis.from_url(os.environ["REDIS_URL"])
    live = mode == "live"
    label = f"{system.key}-{mode}-{repetition}"
    if not system.driver_env:  # Koala and RQ: the bench's own environment
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env.setdefault("LOG_LEVEL", "WARNING")
    pool = Procs(f"{label}-worker", [system.workers(i, live) for i in range(workers)], env, logdir)
    enqueuer = Procs(f"{label}-enqueue", [system.enqueuer(n)], env, logdir) if system.enqueuer else None
    timeout = max(120.0, n / 20)
    try:
        if live:  # warm workers: started, waiting for jobs before the first enqueue
            pool.go()
            pool.expect("waiting", timeout=60)
            time.sleep(warmup)
        if enqueuer:
            enqueuer.go()
            (stamp,) = enqueuer.read_json(timeout)
            t0, t1 = float(stamp["start"]), float(stamp["end"])
        else:
            assert system.enqueue is not None
            t0 = time.time()
            system.enqueue(n)
            t1 = time.time()
            connection.close()
        t_go = t1
        if not live:
            t_go = time.time()
            pool.go()
        t_end = wait_done(system, n, redis, timeout)
    finally:
        pool.stop()
        if enqueuer:
            enqueuer.stop()
    connection.close()
    return Run(
        system=system.name,
        mode=mode,
        repetition=repetition,
        jobs=n,
        enqueue_s=t1 - t0,
        drain_s=None if live else t_end - t_go,
        e2e_s=t_end - t0,
        problems=system.verify(n),
    )


# -- report --------------------------------------------------------------------------------------
def rates(runs: list[Run], what: str) -> list[float]:
    return [r.jobs / v for r in runs if (v := getattr(r, what)) is not None and v > 0]


def cell(values: list[float], spread: bool) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):,.0f}"
    return f"{text} ({min(values):,.0f}-{max(values):,.0f})" if spread and len(values) > 1 else text


def ratio(mine: list[float], theirs: list[float]) -> str:
    return f"{statistics.median(mine) / statistics.median(theirs):.2f}x" if mine and theirs else "-"


def table(results: dict[tuple[str, str], list[Run]], found: dict[str, System], keys: list[str], workers: int) -> list[str]:
    header = [
        "system",
        "jobs",
        "enqueue jobs/s",
        "drain jobs/s",
        "sequential e2e jobs/s",
        "live e2e jobs/s",
        "vs Celery solo (seq / live)",
        "vs RQ (seq / live)",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]

    def measured(key: str, mode: str, what: str) -> list[float]:
        return rates(results.get((key, mode), []), what)

    for key in keys:
        system = found[key]
        runs = [r for mode in MODES for r in results.get((key, mode), [])]
        if not runs:
            continue
        spread = max(len(results.get((key, mode), [])) for mode in MODES) > 1
        seq = measured(key, "sequential", "e2e_s")
        live = measured(key, "live", "e2e_s")
        enqueue = measured(key, "sequential", "enqueue_s") or measured(key, "live", "enqueue_s")
        name = f"{system.name} x{workers}"
        if system.family == "koala":
            name = f"**{name}**"
            vs = [
                f"{ratio(seq, measured(other, 'sequential', 'e2e_s'))} / {ratio(live, measured(other, 'live', 'e2e_s'))}"
                for other in (CELERY, RQ)
            ]
        else:
            vs = ["-", "-"]
        row = [
            name,
            f"{runs[0].jobs:,}",
            cell(enqueue, spread),
            cell(measured(key, "sequential", "drain_s"), spread),
            cell(seq, spread),
            cell(live, spread),
            *vs,
        ]
        if any(r.problems for r in runs):
            row[0] += " **FAILED VERIFY**"
        lines.append("| " + " | ".join(row) + " |")
    return lines


NOTES = [
    "- Same body everywhere: one Redis `INCR` per job; the Redis counter is checked against the job count after every run.",
    "- **sequential**: enqueue every job with no worker running, then release the pre-started workers; "
    "**live**: the workers are started and waiting (`--warmup`, 1 s) before the first enqueue. "
    "end to end = first enqueue -> last job done; drain = release -> last job done.",
    "- last job done = the counter reached the job count and, for the systems that keep a row per job "
    "(Koala, Procrastinate, the floor), no row is left unfinished.",
    "- Celery solo: Redis broker, **no result backend** (results ignored), Celery's default **early ack** "
    "(a message is acknowledged before its task runs: a worker that dies mid-task loses that job), prefetch 4, "
    "`--pool solo` x processes, mingle/gossip/heartbeat off. It keeps nothing per job. In sequential mode its "
    "drain includes the worker's start (its bootsteps run after the release).",
    "- Procrastinate: `task.defer()` one by one, `run_worker(concurrency=1, listen_notify=True, delete_jobs='never')` "
    "per process: a row per job, kept.",
    "- RQ SimpleWorker: `Queue.enqueue()` one by one; burst workers in sequential mode, waiting workers in live mode.",
    "- Koala: `enqueue()` one by one (or one `enqueue_many()` call), `koala_worker --worker-class simple|fork`: "
    "a job row, an attempt row, a lease token and a fenced completion per job.",
    "- raw PostgreSQL claim loop (the floor): one INSERT + commit per job; per job one transaction claims the oldest "
    "row (`FOR UPDATE SKIP LOCKED`), INCRs and marks it succeeded: a durable row per job and nothing else.",
    "- Ratios are of medians (jobs/s); rows are comparable within one run only.",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per run (default 5000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per system (default 2)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions, interleaved (the order rotates each time)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated from: sequential, live (default: both)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--peers-python",
        default=os.environ.get("KOALA_PEERS_PYTHON") or str(PEERS_VENV / "bin" / "python"),
        help="the interpreter with celery and procrastinate (default .venv-peers/bin/python)",
    )
    parser.add_argument("--warmup", type=float, default=1.0, help="live mode: seconds the waiting workers get first")
    parser.add_argument("--results", default=str(ROOT / "bench" / "results"), help="directory for the JSON results")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if args.jobs < 1 or args.workers < 1 or args.repeat < 1:
        parser.error("--jobs, --workers and --repeat must be positive")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")

    setup_django()
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    env = peer_env()
    found = systems(args.peers_python, env)
    keys = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [k for k in keys if k not in found]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; known: {list(found)}")
    peers_ok, peers_info = peers_status(args.peers_python)
    skipped = [k for k in keys if found[k].peer and not peers_ok]
    not_measured = ""
    if skipped:
        not_measured = (
            f"**Not measured: {', '.join(found[k].name for k in skipped)}**: {peers_info}; {HOW_TO_GET_PEERS}. "
            "Only the other rows ran."
        )
        print(not_measured.replace("**", ""), file=sys.stderr, flush=True)
        keys = [k for k in keys if k not in skipped]

    meters = throughput.Meters()
    info = throughput.machine_info(meters)
    info.append(f"- peers: {peers_info if peers_ok else 'not available (' + peers_info + ')'} ({args.peers_python})")
    logdir = Path(tempfile.mkdtemp(prefix="koala-compare-"))
    units = [(key, mode) for key in keys for mode in modes]
    results: dict[tuple[str, str], list[Run]] = {}
    started = time.monotonic()
    try:
        for repetition in range(args.repeat):
            shift = repetition % len(units)
            for key, mode in units[shift:] + units[:shift]:  # interleaved: the order rotates per repetition
                run = run_once(found[key], mode, args.jobs, args.workers, env, logdir, repetition + 1, args.warmup)
                results.setdefault((key, mode), []).append(run)
                drain = f", drain {run.drain_s:.2f}s" if run.drain_s is not None else ""
                failed = f"  VERIFY FAILED: {'; '.join(run.problems)}" if run.problems else ""
                print(
                    f"[rep {repetition + 1}/{args.repeat}] {run.system} ({mode}): enqueue {run.enqueue_s:.2f}s{drain}, "
                    f"e2e {run.jobs / run.e2e_s:,.0f} jobs/s{failed}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        throughput.reset(True)
        for key in keys:
            drop = found[key].drop
            if drop and found[key].unfinished_sql:  # the PostgreSQL schemas (Celery's keys went with FLUSHDB)
                drop()

    print("## Koala against its peers\n")
    print("\n".join(info))
    print(f"- command: {' '.join([Path(sys.executable).name, *sys.argv])}  (total {time.monotonic() - started:.0f}s)")
    print()
    if not_measured:
        print(not_measured + "\n")
    print("\n".join(table(results, found, keys, args.workers)))
    print()
    print("\n".join(NOTES))
    problems = [f"{r.system} {r.mode} rep {r.repetition}: {p}" for runs in results.values() for r in runs for p in r.problems]
    if problems:
        print("\nVERIFICATION FAILED:\n" + "\n".join(f"- {p}" for p in problems))
    else:
        count = sum(len(v) for v in results.values())
        print(f"\nVerified every run ({count}): Redis counter == jobs, and each system's own records.")
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(
        json.dumps(
            {
                "args": vars(args),
                "machine": info,
                "not_measured": [found[k].name for k in skipped],
                "runs": [asdict(r) for runs in results.values() for r in runs],
            },
            indent=2,
        )
    )
    print(f"\nResults: {path}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
