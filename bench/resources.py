"""Resource benchmark: memory per process (worker classes idle and during an export, beat, web) and
log bytes per 1,000 jobs, the numbers behind docs/operations.md's "Resource bounds" sizing rule.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.resources [--rows 1000000] [--jobs 1000] [--skip-logs]

Not a test: it prints markdown tables on stdout (bench/README.md, "Resource bounds").

- **memory**: each process is started fresh (``koala_worker --worker-class simple|fork``,
  ``koala_beat``, ``uvicorn koala.asgi``). *Idle* is read once it has registered and served a
  small warm-up (a 1,000-row export for the workers, a few ``/readyz`` requests for the web) and
  settled for 2 s. *Active export* samples the worker and every child (the fork worker's work
  horse) every 20 ms while one export of ``--rows`` events runs, and keeps the peak of their sum.
  RSS counts shared pages in every process that maps them (a horse shares its parent's pages
  copy-on-write), USS only the process's own (Private_Clean + Private_Dirty of
  /proc/PID/smaps_rollup), PSS shares each shared page among its mappers: PSS sums honestly, and
  is what a cgroup's memory use is closest to.
- **logs**: ``--jobs`` noop jobs (a trivial body: the line is all there is) served by a burst
  worker at LOG_LEVEL=INFO, once with KOALA_LOG_FORMAT=plain and once with json; every byte the
  process writes to stdout and stderr is counted.

It refuses a database whose name lacks "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above
from bench.worker_api import free_port  # noqa: E402
from devtools.servers import wait_listening  # noqa: E402

MIB = 1024 * 1024


@dataclass(frozen=True)
class Memory:
    rss: int
    pss: int
    uss: int

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.rss + other.rss, self.pss + other.pss, self.uss + other.uss)


NOTHING = Memory(0, 0, 0)


def memory_of(pid: int) -> Memory:
    """RSS, PSS and USS of one process, from /proc/PID/smaps_rollup (kB)."""
    fields: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return NOTHING
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * 1024
    return Memory(
        rss=fields.get("Rss", 0),
        pss=fields.get("Pss", 0),
        uss=fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    )


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return out
    for child in children:
        out += tree(int(child))
    return out


def memory_of_tree(pid: int) -> Memory:
    total = NOTHING
    for p in tree(pid):
        total = total + memory_of(p)
    return total


class Sampler:
    """Samples a process tree's memory every 20 ms on a thread; keeps the peak of each sum."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = NOTHING
        self.horse_peak = NOTHING  # the largest single child (the fork worker's horse)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            pids = tree(self.pid)
            parts = [memory_of(p) for p in pids]
            total = NOTHING
            for part in parts:
                total = total + part
            self.peak = Memory(max(self.peak.rss, total.rss), max(self.peak.pss, total.pss), max(self.peak.uss, total.uss))
            for part in parts[1:]:
                if part.pss > self.horse_peak.pss:
                    self.horse_peak = part
            time.sleep(0.02)


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = open(log, "wb")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def base_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1", **extra}


def wait_registered(name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    from workers.models import WorkerProcess

    deadline = time.monotonic() + 60
    while not WorkerProcess.objects.filter(name=name, pid=proc.pid, stopped_at__isnull=True).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"{name} did not start; see {log}")
        time.sleep(0.1)
    time.sleep(0.5)


def measure_worker(worker_class: str, accounts: tuple[object, object], storage: Path, logdir: Path) -> dict[str, Memory]:
    from bench.export_bench import export_once

    warmup, big = accounts
    name = f"bench-resources-{worker_class}-{os.getpid()}"
    log = logdir / f"{name}.log"
    proc = start(
        ["manage.py", "koala_worker", "--queues", "exports", "--worker-class", worker_class, "--name", name],
        base_env(KOALA_EXPORT_ROOT=str(storage)),
        log,
    )
    try:
        wait_registered(name, proc, log)
        started = memory_of_tree(proc.pid)
        (storage / export_once(warmup)[0].output_key).unlink()
        time.sleep(2)
        idle = memory_of_tree(proc.pid)
        with Sampler(proc.pid) as sampler:
            export = export_once(big)[0]
        (storage / export.output_key).unlink()
        return {"start": started, "idle": idle, "active": sampler.peak, "horse": sampler.horse_peak}
    finally:
        stop(proc)


def measure_beat(logdir: Path) -> Memory:
    log = logdir / "beat.log"
    proc = start(["manage.py", "koala_beat"], base_env(), log)
    try:
        time.sleep(8)  # a few ticks: every step has run
        if proc.poll() is not None:
            sys.exit(f"the beat did not start; see {log}")
        return memory_of_tree(proc.pid)
    finally:
        stop(proc)


def measure_web(logdir: Path) -> Memory:
    port = free_port()
    log = logdir / "web.log"
    proc = start(
        ["-m", "uvicorn", "koala.asgi:application", "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        base_env(ALLOWED_HOSTS="127.0.0.1,localhost"),
        log,
    )
    try:
        if not wait_listening(proc, port, timeout=60):
            sys.exit(f"the web process did not answer; see {log}")
        for _ in range(50):
            for path in ("/readyz", "/healthz", "/admin/login/"):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                    answer.read()
        time.sleep(1)
        return memory_of_tree(proc.pid)
    finally:
        stop(proc)


def log_bytes(jobs: int, log_format: str, logdir: Path) -> tuple[int, int, int]:
    """Bytes and lines a burst worker writes serving ``jobs`` noop jobs at INFO; and the attempts."""
    from workers.models import Attempt, Job
    from workers.services.jobs import JobSpec, enqueue_many

    Job.objects.filter(state="queued").delete()  # a scratch database: only these jobs are due
    ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop") for _ in range(jobs)])]
    log = logdir / f"logs-{log_format}.log"
    proc = start(
        ["manage.py", "koala_worker", "--burst", "--queues", "default", "--name", f"bench-logs-{log_format}-{os.getpid()}"],
        base_env(LOG_LEVEL="INFO", KOALA_LOG_FORMAT=log_format),
        log,
    )
    if proc.wait(timeout=600) != 0:
        sys.exit(f"the log worker failed; see {log}")
    done = Attempt.objects.filter(job_id__in=ids).exclude(outcome=None).count()
    data = log.read_bytes()
    return len(data), data.count(b"\n"), done


def mib(n: int) -> str:
    return f"{n / MIB:,.1f}"


STATES = {"start": "registered, nothing run", "idle": "idle after a warm-up export", "active": "active export"}


def row(process: str, state: str, m: Memory) -> str:
    return f"| {process} | {state} | {mib(m.rss)} | {mib(m.pss)} | {mib(m.uss)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="events in the measured export (default 1,000,000)")
    parser.add_argument("--jobs", type=int, default=1000, help="noop jobs for the log measurement (default 1,000)")
    parser.add_argument("--skip-logs", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--force", action="store_true", help="allow a database without 'bench' in its name, or Redis db 0")
    args = parser.parse_args()
    setup_django()
    guard(force=args.force, database_action="create demo data", redis_action="enqueue into")

    from bench.export_bench import prepare_data

    logdir = Path(tempfile.mkdtemp(prefix="koala-resources-"))
    storage = logdir / "exports"
    storage.mkdir()
    print(f"# Resource benchmark ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, logs in {logdir})\n")
    try:
        if not args.skip_memory:
            accounts = prepare_data([1000, args.rows])
            pair = (accounts[1000], accounts[args.rows])
            per_class = {worker_class: measure_worker(worker_class, pair, storage, logdir) for worker_class in ("simple", "fork")}
            beat = measure_beat(logdir)
            web = measure_web(logdir)
            print(f"## Memory per process (MiB; active = peak during one export of {args.rows:,} events)\n")
            print("| process | state | RSS | PSS | USS |")
            print("| --- | --- | --- | --- | --- |")
            rows: list[str] = []
            for worker_class, found in per_class.items():
                for state in ("start", "idle", "active"):
                    label = STATES[state] + (" (worker + horse)" if worker_class == "fork" and state == "active" else "")
                    rows.append(row(f"worker `{worker_class}`", label, found[state]))
                if worker_class == "fork":
                    rows.append(row("worker `fork`", "its work horse alone, at its peak", found["horse"]))
            rows.append(row("beat", "running", beat))
            rows.append(row("web (uvicorn, 1 process)", "after 150 requests", web))
            print("\n".join(rows))
            print()
            for worker_class, found in per_class.items():
                extra = found["active"].pss - found["idle"].pss
                print(f"- `{worker_class}`: one active export adds {mib(extra)} MiB PSS over idle")
            print()
        if not args.skip_logs:
            print(f"## Log bytes per {args.jobs:,} jobs at LOG_LEVEL=INFO (noop jobs, one burst worker)\n")
            print("| KOALA_LOG_FORMAT | bytes | lines | attempts | bytes per attempt | bytes per 1,000 jobs |")
            print("| --- | --- | --- | --- | --- | --- |")
            for log_format in ("plain", "json"):
                size, lines, done = log_bytes(args.jobs, log_format, logdir)
                per = size / max(done, 1)
                print(f"| {log_format} | {size:,} | {lines:,} | {done:,} | {per:,.0f} | {per * 1000:,.0f} |")
            print()
    finally:
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
