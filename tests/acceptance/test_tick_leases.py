"""koala_tick as the timers run it, in real processes: a second run refuses (exit 75) while the
first holds the task's lease; a run killed with SIGKILL never releases it, and once it expires
the next run proceeds; an unknown task is refused with exit 2 and changes nothing.

The first run is held mid-task by a real lock: the test's session takes ``workers_job`` ACCESS EXCLUSIVE,
so the prune's first batch waits on it (its lease already taken) for as long as the test likes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.db import connection, transaction

from tests.conftest import REPO, wait_for, worker_env
from workers.models import TickLease
from workers.services import ticks

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The blocked run's session bounds follow KOALA_LEASE_SECONDS (lock_timeout is a sixth of it):
# 120 s lets its first batch wait 20 s on the test's lock, longer than this test needs.
ENV = {"KOALA_LEASE_SECONDS": "120", "KOALA_HEARTBEAT_SECONDS": "1"}
# koala_tick --lease-seconds for the run that is killed: long enough for a second manage.py to start
# and be refused on a busy machine, short enough to wait out.
LEASE = 30


def tick(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), "koala_tick", *args],
        cwd=REPO,
        env=worker_env(**ENV),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def held_by(pid: int) -> bool:
    row = TickLease.objects.filter(name="prune").first()
    return bool(row and row.owner.endswith(f":{pid}") and row.expires_at is not None)


def lease_expired() -> bool:
    """By the server's clock now (clock_timestamp: now() stands still inside the test's locking transaction)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT expires_at < clock_timestamp() FROM workers_ticklease WHERE name = 'prune'")
        return bool(cursor.fetchone()[0])


def test_a_second_run_refuses_while_the_first_holds_the_lease_and_a_killed_runs_lease_expires() -> None:
    # The test's session holds workers_job ACCESS EXCLUSIVE until the atomic block ends (its
    # own reads of the lease row see the other sessions' commits: READ COMMITTED).
    locked = transaction.atomic()
    locked.__enter__()
    with connection.cursor() as cursor:
        cursor.execute("LOCK TABLE workers_job IN ACCESS EXCLUSIVE MODE")
    first = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "koala_tick", "prune", "--lease-seconds", str(LEASE)],
        cwd=REPO,
        env=worker_env(**ENV),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for(lambda: held_by(first.pid), timeout=30, what="the first run to take the prune lease")
        assert first.poll() is None, "it waits on the test's lock, mid-task"

        second = tick("prune")
        assert second.returncode == ticks.EXIT_PREVIOUS_RUNNING, second.stderr
        assert "previous run of prune is still running" in second.stderr and f":{first.pid}" in second.stderr
        assert held_by(first.pid), "the refused run changed nothing"

        os.killpg(first.pid, signal.SIGKILL)  # a crash: no release
        first.wait(timeout=10)
        row = TickLease.objects.get(name="prune")
        assert row.released_at is None and row.expires_at is not None

        assert not lease_expired(), "a crashed run's lease stands until it expires (nobody released it)"
        locked.__exit__(None, None, None)  # the lock goes; only the lease still stands in the way
        wait_for(lease_expired, timeout=LEASE + 10, interval=0.5, what="the killed run's lease to expire")

        then = tick("prune")
        assert then.returncode == ticks.EXIT_OK, then.stderr
        assert "tick prune: jobs=0" in then.stdout and "had crashed" in then.stdout, then.stdout
        row = TickLease.objects.get(name="prune")
        assert (row.expires_at, row.last_outcome) == (None, "ok") and not row.owner.endswith(f":{first.pid}")
    finally:
        if connection.in_atomic_block:
            locked.__exit__(None, None, None)
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)


def test_an_unknown_task_exits_2_with_the_tasks_named_and_changes_nothing() -> None:
    done = tick("nope")
    assert done.returncode == ticks.EXIT_USAGE
    last = done.stderr.strip().splitlines()[-1]
    assert "no tick task 'nope'" in last and "prune" in last and "Traceback" not in done.stderr, done.stderr
    assert not TickLease.objects.exists()
    listed = tick("--list")
    assert listed.returncode == 0 and "prune" in listed.stdout and "never ran" in listed.stdout, listed.stdout
