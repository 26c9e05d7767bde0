"""Throughput across hosts: Koala's workers on two network-namespace hosts against a database host,
beside the same number of workers on the database host itself, scaled 2 -> 4 -> 8 processes.

    sudo .venv/bin/python -m bench.multihost [--jobs 3000] [--workers 2,4,8] [--repeat 1]

Not a test: it prints machine information and a markdown table (bench/README.md, "Workers on
many hosts"). It needs root: it builds its own hosts with tests/support/netns.py (a switch
namespace, a ``db`` host running a fresh PostgreSQL cluster and redis-server, hosts ``w1`` and
``w2``), so it writes into nothing but its own throwaway cluster, deleted at the end.

Per run: the jobs (the ``incr`` body, Koala's enqueue_many, as bench/throughput.py's
"koala simple, enqueue_many()" variant) are enqueued first, then released to N ready
``bench._worker koala-simple`` processes placed either all on ``db`` ("db host") or half on
``w1`` and half on ``w2`` ("two hosts"). Drain is measured as in bench/throughput.py: release ->
last worker loop returned. Beside it, while the workers drain:

- claim latency: a probe process in the same placement times one claim statement
  (``leases.claim_next`` on an empty queue of its own, so it never takes the workers' jobs)
  every 10 ms: p50 / p95, the round trip a worker pays per claim from there;
- database CPU: user+system time of the db host's postgres processes (/proc/PID/stat) over the
  drain, in cores; machine CPU: all cores busy (/proc/stat), in %;
- lock waits: pg_stat_activity sampled every 50 ms: mean backends active, and mean waiting on a
  heavyweight lock (wait_event_type Lock) or an LWLock.

The two placements of a count run back to back, in alternating order from round to round.
Every host shares this machine's CPUs: the two-host column measures the network path's overhead
(veth, bridge, TCP instead of the same namespace's TCP), not added capacity.
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import setup_django  # noqa: E402 - after the path set-up above

PLACEMENTS = ("db host", "two hosts")
PROBE_QUEUE = "bench-probe"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per run (default 3000)")
    parser.add_argument("--workers", default="2,4,8", help="worker process counts (default 2,4,8)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; the table shows medians")
    parser.add_argument("--probe", type=float, default=None, help=argparse.SUPPRESS)  # the claim probe (internal)
    return parser.parse_args()


# -- the claim probe: runs inside a host namespace ---------------------------------------------
def probe(seconds: float) -> None:
    setup_django()
    from django.db import connection

    from workers.services import leases

    connection.ensure_connection()
    samples: list[float] = []
    print("ready", flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.perf_counter()
        assert (
            leases.claim_next(queue=PROBE_QUEUE, served=["incr@1"], worker="bench-probe", lease_seconds=30, gated=False) is None
        )
        samples.append((time.perf_counter() - began) * 1000)
        time.sleep(0.01)
    print(json.dumps(samples), flush=True)


# -- meters ---------------------------------------------------------------------------------------
def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class ActivitySampler(threading.Thread):
    """pg_stat_activity every 50 ms on its own connection (the db host's unix socket), and the
    CPU ticks of every postgres process seen meanwhile: a backend ends with its worker's
    connection, before the run's end could read it."""

    def __init__(self, dsn: dict[str, Any], db_pids: Any) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.db_pids = db_pids
        self.stop = threading.Event()
        self.samples: list[tuple[int, int, int]] = []
        self.baseline = {pid: cpu_ticks([pid]) for pid in db_pids()}
        self.last: dict[int, int] = dict(self.baseline)

    def sample_cpu(self) -> None:
        for pid in self.db_pids():
            ticks = cpu_ticks([pid])
            if ticks:
                self.last[pid] = max(ticks, self.last.get(pid, 0))

    def db_cpu_seconds(self) -> float:
        ticks = sum(value - self.baseline.get(pid, 0) for pid, value in self.last.items())
        return ticks / os.sysconf("SC_CLK_TCK")

    def run(self) -> None:
        import psycopg

        with psycopg.connect(**self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'active'), "
                    "count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'Lock'), "
                    "count(*) FILTER (WHERE state = 'active' AND wait_event_type = 'LWLock') "
                    "FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ).fetchone()
                assert row is not None
                self.samples.append((int(row[0]), int(row[1]), int(row[2])))
                self.sample_cpu()
                self.stop.wait(0.05)
        self.sample_cpu()

    def means(self) -> tuple[float, float, float]:
        if not self.samples:
            return (0.0, 0.0, 0.0)
        return tuple(statistics.fmean(column) for column in zip(*self.samples, strict=True))  # type: ignore[return-value]


# -- one run ----------------------------------------------------------------------------------------
@dataclass
class Result:
    workers: int
    placement: str
    jobs: int
    drain_s: float
    claim_p50_ms: float
    claim_p95_ms: float
    db_cores: float
    worker_cores: float
    machine_busy_pct: float
    active: float
    lock_waits: float
    lwlock_waits: float
    problems: list[str]


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def _start(ns: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, *argv],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
        text=True,
    )


def run_once(cluster: Any, workers: int, placement: str, jobs: int, env: dict[str, str], logdir: Path) -> Result:
    from django.conf import settings

    from bench.throughput import koala_enqueue_many, koala_verify, reset

    reset(True)
    hosts = [cluster.db] if placement == "db host" else [cluster["w1"], cluster["w2"]]
    procs = [
        _start(
            hosts[i % len(hosts)].ns,
            [sys.executable, "-m", "bench._worker", "koala-simple", "default"],
            env,
            logdir / f"w{i}.log",
        )
        for i in range(workers)
    ]
    prober = _start(hosts[-1].ns, [sys.executable, "-m", "bench.multihost", "--probe", "3"], env, logdir / "probe.log")
    try:
        for proc in [*procs, prober]:
            line = _readline(proc, timeout=90)
            if line.strip() != "ready":
                raise RuntimeError(f"a process did not start ({line!r}); see {logdir}")
        koala_enqueue_many(jobs)
        busy0, total0 = machine_busy()
        sampler = ActivitySampler(
            {"host": str(cluster.pgdata), "port": settings.DATABASES["default"]["PORT"], "user": "root", "dbname": "koala"},
            cluster.db_pids,
        )
        sampler.start()
        t_go = time.time()
        for proc in [*procs, prober]:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        times = []
        for proc in procs:
            line = _readline(proc, timeout=max(300.0, jobs / 5))
            if not line:
                raise RuntimeError(f"a worker did not finish; see {logdir}")
            times.append(json.loads(line))
        t_end = max(t["end"] for t in times)
        busy1, total1 = machine_busy()
        sampler.stop.set()
        sampler.join()
        samples = json.loads(_readline(prober, timeout=30) or "[]")
    finally:
        for proc in [*procs, prober]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    drain = t_end - t_go
    quantiles = statistics.quantiles(samples, n=20) if len(samples) >= 2 else [float("nan")] * 19
    active, locks, lwlocks = sampler.means()
    return Result(
        workers=workers,
        placement=placement,
        jobs=jobs,
        drain_s=drain,
        claim_p50_ms=statistics.median(samples) if samples else float("nan"),
        claim_p95_ms=quantiles[18],
        db_cores=sampler.db_cpu_seconds() / drain,
        worker_cores=sum(t["cpu"] for t in times) / drain,
        machine_busy_pct=100.0 * (busy1 - busy0) / max(total1 - total0, 1),
        active=active,
        lock_waits=locks,
        lwlock_waits=lwlocks,
        problems=koala_verify(jobs),
    )


def host_env(cluster: Any, workers: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": cluster.database_url(),
            "REDIS_URL": cluster.redis_url(),
            "DJANGO_SETTINGS_MODULE": "koala.settings",
            "KOALA_DOORBELL_DEPTH": str(max(workers, 4)),  # docs/configuration.md: >= worker processes per queue
            "LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


def table(results: list[Result]) -> list[str]:
    header = [
        "workers", "placement", "jobs", "drain jobs/s", "two hosts / db host", "claim p50 ms", "claim p95 ms",
        "db CPU (cores)", "workers' CPU (cores)", "machine CPU busy", "active backends", "Lock waits", "LWLock waits",
    ]  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    cells: dict[tuple[int, str], list[Result]] = {}
    for r in results:
        cells.setdefault((r.workers, r.placement), []).append(r)
    for (workers, placement), runs in cells.items():

        def med(attr: str, runs: list[Result] = runs) -> float:
            return statistics.median(getattr(r, attr) for r in runs)

        rate = statistics.median(r.jobs / r.drain_s for r in runs)
        base = cells.get((workers, "db host"))
        ratio = rate / statistics.median(r.jobs / r.drain_s for r in base) if base and placement != "db host" else 1.0
        lines.append(
            f"| {workers} | {placement} | {runs[0].jobs} | {rate:,.0f} | {ratio:.2f} | {med('claim_p50_ms'):.2f} | "
            f"{med('claim_p95_ms'):.2f} | {med('db_cores'):.2f} | {med('worker_cores'):.2f} | "
            f"{med('machine_busy_pct'):.0f}% | {med('active'):.1f} | "
            f"{med('lock_waits'):.2f} | {med('lwlock_waits'):.2f} |"
        )
    return lines


def main() -> int:
    args = parse_args()
    if args.probe is not None:
        probe(args.probe)
        return 0
    from tests.support.netns import Cluster, netns_unavailable

    reason = netns_unavailable()
    if reason:
        sys.exit(f"bench.multihost: {reason}")
    counts = [int(n) for n in args.workers.split(",")]
    cluster = Cluster(roles=("db", "w1", "w2")).start()
    try:
        migrate = subprocess.run(
            ["ip", "netns", "exec", cluster["w1"].ns, sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=host_env(cluster, 2) | {"SECRET_KEY": "bench-multihost-" + "x" * 40},
        )
        if migrate.returncode:
            sys.exit("migrate failed")
        os.environ.update({"DATABASE_URL": cluster.database_url(), "REDIS_URL": cluster.redis_url()})
        setup_django(KOALA_DOORBELL_DEPTH=str(max(counts)))
        results: list[Result] = []
        with cluster.orm():
            import django
            from django.db import connection

            with connection.cursor() as cursor:
                cursor.execute("SHOW server_version")
                (pg_version,) = cursor.fetchone()
            for round_number in range(args.repeat):
                for workers in counts:
                    # Alternate which placement goes first: the machine's other load drifts.
                    for placement in PLACEMENTS if (round_number + workers) % 2 == 0 else PLACEMENTS[::-1]:
                        logdir = cluster.dir / f"run-{round_number}-{workers}-{placement.replace(' ', '-')}"
                        logdir.mkdir()
                        env = host_env(cluster, workers) | {"SECRET_KEY": "bench-multihost-" + "x" * 40}
                        result = run_once(cluster, workers, placement, args.jobs, env, logdir)
                        results.append(result)
                        print(
                            f"[run {round_number + 1}/{args.repeat}] {workers} workers, {placement}: "
                            f"drain {result.drain_s:.2f}s, "
                            f"claim p50 {result.claim_p50_ms:.2f} ms, db {result.db_cores:.2f} cores"
                            + (f"; PROBLEMS: {result.problems}" if result.problems else ""),
                            file=sys.stderr,
                            flush=True,
                        )
        print(
            f"- nproc: {len(os.sched_getaffinity(0))}, {platform.system()} {platform.release()}, Python "
            f"{platform.python_version()}, Django {django.get_version()}"
        )
        print(
            f"- PostgreSQL {pg_version} (a cluster of its own on the db host: fsync=off, synchronous_commit=off); "
            "redis-server there too"
        )
        print(f"- hosts: network namespaces on one bridge ({', '.join(h.role for h in cluster.hosts.values())}); same CPUs")
        print()
        print("\n".join(table(results)))
        problems = [r for r in results if r.problems]
        for r in problems:
            print(f"\nPROBLEMS ({r.workers} workers, {r.placement}): {r.problems}")
        return 1 if problems else 0
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
