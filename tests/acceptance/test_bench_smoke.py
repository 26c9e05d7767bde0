"""Every benchmark runs end to end with tiny sizes (what `make bench*` runs, against the test database).

The benchmarks are not tests of speed; this only keeps them runnable: each one is started the
way the Makefile starts it (``python -m bench.NAME`` from the repository root), so a module that
shadows an app, a broken import or a worker that cannot start fails here, in both CI passes.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

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
    "scale": (
        ["--jobs", "2000", "--reps", "3", "--page-reps", "2", "--dashboard-reps", "1", "--before-reps", "1", "--force"],
        "| engine | claim (leases.claim_next) |",
    ),
    "http_start": (["--calls", "5", "--repeat", "1", "--workers", "2", "--force"], "| `POST /api/v1/jobs`, 1 client |"),
    "worker_api": (
        ["--idle-workers", "5", "--seconds", "2", "--jobs", "50", "--latency-jobs", "5", "--settle", "1", "--force"],
        "| drain | HTTP / RQ jobs/s |",
    ),
}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_benchmark_runs_with_tiny_sizes(name: str, redis_clean: None) -> None:
    args, expected = BENCHES[name]
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocess(),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "bench-smoke-secret-key-" + "x" * 40,
    }
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
    if name == "worker_api":
        # Every measured number in the table is finite (the targets are not checked: not a speed test).
        rows = [line for line in done.stdout.splitlines() if line.startswith(("| idle", "| wake", "| drain"))]
        assert len(rows) == 10, output[-4000:]
        for row in rows:
            value = row.split("|")[3].replace(",", "")
            numbers = [float(n) for n in re.findall(r"inf|nan|\d+(?:\.\d+)?", value)]
            assert numbers and all(math.isfinite(n) for n in numbers), row
