"""Starting a job over HTTP against an in-process ``enqueue()``, in the same run.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_bench REDIS_URL=redis://127.0.0.1:6379/5 \\
        python -m bench.http_start [--calls 500] [--repeat 3] [--workers 2] [--profile FILE]

Not a test: it prints a markdown table (bench/README.md, "Starting a job over HTTP"). The server
is uvicorn as deployed (devtools/servers.py's command, deploy/systemd/koala-web.service's
``--workers 2``, no access log, DEBUG off); one client holds one keep-alive connection and sends
``POST /api/v1/jobs`` sequentially (each call answered before the next is sent). The in-process
row is ``workers.services.jobs.enqueue()`` called in this process, one by one, with the same
kind and input. Repetitions alternate HTTP and in-process; medians with min-max.

``--profile FILE``: one server process (``--workers 1``) runs under cProfile for the HTTP
calls of one extra round, and the profile's top functions by cumulative time are printed (the
raw profile is written to FILE for ``python -m pstats``).

DESTRUCTIVE for the databases it is pointed at: it TRUNCATEs Koala's job tables and FLUSHDBs the
Redis db; it refuses a database name without "bench" and Redis db 0 unless --force.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, Python puts bench/ first on sys.path: import from the repository root only.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.setup import guard, setup_django  # noqa: E402 - after the path set-up above
from bench.worker_api import KEY, Client, Server, free_port  # noqa: E402

DEPLOY_WORKERS = 2  # deploy/systemd/koala-web.service: --workers 2
PROFILE_SERVER = """\
import cProfile, os, signal, sys
import uvicorn
profile = cProfile.Profile()
def dump(*_):
    profile.disable()
    profile.dump_stats(os.environ["BENCH_PROFILE_FILE"])
    sys.exit(0)
signal.signal(signal.SIGTERM, dump)
sys.argv = ["uvicorn", *sys.argv[1:]]
profile.enable()
uvicorn.main()
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="sequential calls per repetition and side (default 500)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each side, interleaved (default 3)")
    parser.add_argument("--workers", type=int, default=DEPLOY_WORKERS, help="uvicorn processes (default 2, as deployed)")
    parser.add_argument("--profile", type=Path, default=None, help="also profile one server process; write the profile here")
    parser.add_argument("--force", action="store_true", help="allow a database name without 'bench' / Redis db 0")
    args = parser.parse_args()
    if min(args.calls, args.repeat, args.workers) < 1:
        parser.error("sizes must be positive")
    return args


def in_process(calls: int) -> float:
    """Seconds for ``calls`` sequential enqueue() calls in this process."""
    from django.db import connection

    from workers.services.jobs import enqueue

    enqueue(kind="incr", input={"key": KEY})  # the connection is open before the clock starts
    t0 = time.perf_counter()
    for _ in range(calls):
        enqueue(kind="incr", input={"key": KEY}, created_by="bench")
    seconds = time.perf_counter() - t0
    connection.close()
    return seconds


def over_http(client: Client, calls: int) -> tuple[float, list[float]]:
    """Seconds for ``calls`` sequential POST /api/v1/jobs on one keep-alive connection, and each call's seconds."""
    body = {"kind": "incr", "input": {"key": KEY}}
    status, answer = client.post("/api/v1/jobs", body)  # warm: the connection and the key cache
    if status != 201:
        sys.exit(f"POST /api/v1/jobs answered {status} {answer}")
    each = []
    t0 = time.perf_counter()
    for _ in range(calls):
        t = time.perf_counter()
        status, answer = client.post("/api/v1/jobs", body)
        each.append(time.perf_counter() - t)
        if status != 201:
            sys.exit(f"POST /api/v1/jobs answered {status} {answer}")
    return time.perf_counter() - t0, each


def profiled(logdir: Path, key: str, calls: int, out: Path) -> str:
    """One server process under cProfile serving ``calls`` starts; the top of its profile."""
    import pstats

    from devtools.servers import uvicorn_command, wait_listening

    script = logdir / "profile_server.py"
    script.write_text(PROFILE_SERVER)
    port = free_port()
    command = uvicorn_command(host="127.0.0.1", port=port, access_log=False, graceful_seconds=2)
    env = {**os.environ, "LOG_LEVEL": "WARNING", "BENCH_PROFILE_FILE": str(out.resolve())}
    proc = subprocess.Popen([sys.executable, str(script), *command[3:]], cwd=ROOT, env=env)
    try:
        if not wait_listening(proc, port, timeout=60):
            sys.exit("the profiled server did not start")
        client = Client(port, key)
        over_http(client, calls)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stats = pstats.Stats(str(out))
    import io

    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(45)
    return text.getvalue()


def spread(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}"


def main() -> int:
    args = parse_args()
    setup_django()
    guard(force=args.force, database_action="TRUNCATE Koala's tables", redis_action="FLUSHDB")
    from django.conf import settings
    from django.db import connection

    from api import keys
    from bench.throughput import reset

    started = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="koala-bench-start-"))
    reset(True)
    _, key = keys.create_key(name="bench http_start", scopes=["execute"], actor="bench")
    connection.close()
    server = Server(logdir, "api-start", workers=args.workers)
    client = Client(server.port, key)
    local_rates, http_rates, latencies = [], [], []
    try:
        for _ in range(args.repeat):
            http_seconds, each = over_http(client, args.calls)
            http_rates.append(args.calls / http_seconds)
            latencies += each
            local_rates.append(args.calls / in_process(args.calls))
            print(f"http {http_rates[-1]:,.0f}/s  in-process {local_rates[-1]:,.0f}/s", file=sys.stderr, flush=True)
    finally:
        client.close()
        server.stop()
    profile = profiled(logdir, key, args.calls, args.profile) if args.profile else ""
    reset(True)

    local, http = statistics.median(local_rates), statistics.median(http_rates)
    p50, p95 = (statistics.quantiles(latencies, n=20)[i] * 1000 for i in (9, 18)) if len(latencies) > 1 else (0.0, 0.0)
    print("## Koala: starting a job over HTTP vs in-process enqueue()\n")
    print(
        f"- nproc {len(os.sched_getaffinity(0))}, Python {sys.version.split()[0]}, DEBUG {settings.DEBUG}; server: "
        f"uvicorn koala.asgi, {args.workers} process(es), no access log; one keep-alive client, sequential calls"
    )
    print(f"- command: {' '.join([Path(sys.executable).name, *sys.argv])}  (total {time.monotonic() - started:.0f}s)")
    print()
    print("| side | calls/s (median) | min-max | ms/call | vs in-process |")
    print("|---|---:|---:|---:|---:|")
    print(f"| in-process `enqueue()` | {local:,.0f} | {spread(local_rates)} | {1000 / local:.2f} | 1.00x |")
    print(
        f"| `POST /api/v1/jobs`, 1 client | {http:,.0f} | {spread(http_rates)} | {1000 / http:.2f} "
        f"(p50 {p50:.2f}, p95 {p95:.2f}) | {http / local:.2f}x |"
    )
    if profile:
        print("\n### One server process under cProfile (cumulative)\n")
        print("```")
        print(profile.strip())
        print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
