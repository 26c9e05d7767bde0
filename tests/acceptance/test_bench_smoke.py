"""Every benchmark runs end to end with tiny sizes (what `make bench*` runs, against the test database).

The benchmarks are not tests of speed; this only keeps them runnable: each one is started the
way the Makefile starts it (``python -m bench.NAME`` from the repository root), so a module that
shadows an app, a broken import or a worker that cannot start fails here, in both CI passes.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import REPO, database_url_for_subprocess

# transaction=True: the benchmarks' own processes must see the rows (and TRUNCATE them).
# services: the benchmarks open statistics connections of their own from the connection settings
# (a unix socket or TCP: bench/throughput.py, bench/export_bench.py).
pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]

# --force: the test database's name lacks "bench" (the scripts' guard against pointing them at real data).
BENCHES = {
    "throughput": (["--jobs", "30", "--fork-jobs", "10", "--workers", "1", "--force"], "Verified every run"),
    "export_bench": (["--sizes", "2000", "--force"], "| 2,000 |"),
    "capacity": (["--quick", "--force"], "Recommended exports budget default: concurrency_limit="),
    "scale": (
        ["--jobs", "2000", "--reps", "3", "--page-reps", "2", "--dashboard-reps", "1", "--before-reps", "1", "--force"],
        "| engine | claim (leases.claim_next) |",
    ),
    "pgbouncer": (["--jobs", "30", "--workers", "1", "--repeat", "1", "--force"], "| PgBouncer (transaction) |"),
    "resources": (["--rows", "2000", "--jobs", "20", "--force"], "| worker `fork` | its work horse alone, at its peak |"),
    "http_start": (["--calls", "5", "--repeat", "1", "--workers", "2", "--force"], "| `POST /api/v1/jobs`, 1 client |"),
    "worker_api": (
        ["--idle-workers", "5", "--seconds", "2", "--jobs", "50", "--latency-jobs", "5", "--settle", "1", "--force"],
        "| drain | HTTP / RQ jobs/s |",
    ),
}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_benchmark_runs_with_tiny_sizes(name: str, redis_clean: None) -> None:
    args, expected = BENCHES[name]
    env = bench_env()
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert expected in done.stdout, output[-4000:]
    if name == "capacity":
        # One row per level, each with exports finished and HTTP latencies measured (not judged).
        rows = [line for line in done.stdout.splitlines() if re.match(r"\| [12] \|", line)]
        assert len(rows) == 2, output[-4000:]
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert float(cells[1].replace(",", "")) > 0, row  # exports/min
            assert all(math.isfinite(float(n)) for n in cells[7].split(" / ")), row  # API p50 / p95
    if name == "worker_api":
        # Every measured number in the table is finite (the targets are not checked: not a speed test).
        rows = [line for line in done.stdout.splitlines() if line.startswith(("| idle", "| wake", "| drain"))]
        assert len(rows) == 10, output[-4000:]
        for row in rows:
            value = row.split("|")[3].replace(",", "")
            numbers = [float(n) for n in re.findall(r"inf|nan|\d+(?:\.\d+)?", value)]
            assert numbers and all(math.isfinite(n) for n in numbers), row


def bench_env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-smoke-secret-key-" + "x" * 40,
    }


# bench/compare.py: every system, both modes. The peers (Celery, Procrastinate) need .venv-peers:
# this test builds it with scripts/bootstrap-peers (about 11 s from pip's cache on the 2-core
# machine, a no-op once stamped), so CI runs the peers for real; it never skips them.
COMPARE_ARGS = ["--jobs", "10", "--workers", "1", "--warmup", "0.2", "--force"]
COMPARE_ROWS = [
    "Celery solo x1",
    "Procrastinate x1",
    "rq SimpleWorker x1",
    "**koala simple, enqueue() x1**",
    "**koala simple, enqueue_many() x1**",
    "**koala fork, enqueue() x1**",
    "raw PostgreSQL claim loop, 1 row/txn x1",
]


def run_compare(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.compare", *COMPARE_ARGS, "--results", str(tmp_path), *args],
        cwd=REPO,
        env=bench_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
    )


def test_compare_runs_every_system_with_the_peers_from_venv_peers(redis_clean: None, tmp_path: Path) -> None:
    built = subprocess.run([str(REPO / "scripts" / "bootstrap-peers")], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    done = run_compare([], tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Not measured" not in output, output[-4000:]
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in done.stdout.splitlines() if line.startswith("| ")}
    for row in COMPARE_ROWS:
        assert row in rows, (row, output[-4000:])
    # Koala's rows carry their ratios to Celery and RQ in both modes; the others do not.
    assert re.search(r"\| [\d.]+x / [\d.]+x \| [\d.]+x / [\d.]+x \|$", rows["**koala simple, enqueue() x1**"]), rows
    assert "Verified every run (14)" in done.stdout, output[-4000:]
    assert "early ack" in done.stdout and "no result backend" in done.stdout
    (results,) = tmp_path.glob("compare-*.json")
    runs = json.loads(results.read_text())["runs"]
    assert sorted({(r["system"], r["mode"]) for r in runs}) == sorted(
        (row.strip("*").rsplit(" x", 1)[0], mode) for row in COMPARE_ROWS for mode in ("sequential", "live")
    )
    assert all(r["problems"] == [] and r["e2e_s"] > 0 for r in runs)


def test_compare_without_venv_peers_says_the_peers_were_not_measured(redis_clean: None, tmp_path: Path) -> None:
    done = run_compare(
        ["--variants", "celery,rq-simple", "--modes", "sequential", "--peers-python", str(tmp_path / "none")], tmp_path
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "**Not measured: Celery solo**" in done.stdout and "make bench-peers" in done.stdout, output[-4000:]
    assert "| rq SimpleWorker x1 |" in done.stdout and "| Celery solo" not in done.stdout, output[-4000:]
