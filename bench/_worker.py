"""One benchmark worker process (started by bench/throughput.py from the repository root; not for direct use).

    python -m bench._worker {rq-simple|rq-fork|koala-simple|koala-fork} QUEUE [forever]

It does all its imports and set-up first, prints ``ready``, waits for a line on
stdin (the "go" after the enqueue phase), runs the worker in burst mode, and
prints ``{"start": t, "end": t, "cpu": s}`` (wall clock; CPU seconds used after "go" by this
process and its reaped children, i.e. forked work horses) when the worker's loop returns,
so process start-up and interpreter teardown are outside every measurement.

With ``forever`` (bench/compare.py's live mode) the worker is not in burst mode: after "go" it
prints ``waiting`` and works until SIGTERM (every worker's graceful stop).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script (python bench/NAME.py), Python puts bench/ first on sys.path, where a bench
# module could shadow a top-level package: import from the repository root only, as -m does.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def prepare(variant: str, queue: str, burst: bool = True) -> Callable[[], object]:
    if variant in ("rq-simple", "rq-fork"):
        from redis import Redis
        from rq import Queue, SimpleWorker, Worker

        import bench.bodies  # noqa: F401  (the body module, as a deployed worker would have it)

        conn = Redis.from_url(os.environ["REDIS_URL"])
        conn.ping()
        cls = SimpleWorker if variant == "rq-simple" else Worker
        worker = cls([Queue(queue, connection=conn)], connection=conn)
        return lambda: worker.work(burst=burst, logging_level="WARNING")
    if variant in ("koala-simple", "koala-fork"):
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "koala.settings")
        import django

        django.setup()
        from django.core.management import call_command

        # Exactly `manage.py koala_worker --worker-class X --burst` (default queues).
        options = ["--worker-class", variant.split("-", 1)[1]] + (["--burst"] if burst else [])
        return lambda: call_command("koala_worker", *options)
    raise SystemExit(f"unknown variant {variant!r}")


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the forking workers' work horses)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


def main() -> None:
    variant, queue = sys.argv[1], sys.argv[2]
    forever = sys.argv[3:] == ["forever"]
    run = prepare(variant, queue, burst=not forever)
    print("ready", flush=True)
    if not sys.stdin.readline():
        return  # the bench went away before "go"
    if forever:
        print("waiting", flush=True)
    profile_dir = os.environ.get("BENCH_PROFILE_DIR")
    cpu_at_go = cpu_seconds()
    start = time.time()
    if profile_dir:  # cProfile of this process's worker loop (forked horses are not covered)
        import cProfile

        profiler = cProfile.Profile()
        profiler.runcall(run)
        end = time.time()
        profiler.dump_stats(str(Path(profile_dir) / f"{variant}-{os.getpid()}.prof"))
    else:
        run()
        end = time.time()
    print(json.dumps({"start": start, "end": end, "cpu": cpu_seconds() - cpu_at_go}), flush=True)


if __name__ == "__main__":
    main()
