"""R3 with real worker processes: the dashboard tells a crash loop from a stuck worker.

A crash loop is repeated abnormal exits (here: one worker name restarted after kill -9, as
a service manager would); clean stops (SIGTERM, Ctrl-C) never count. A stuck worker is
alive, heartbeating, yet makes no progress. All are read from the same function the
dashboard renders, and from each worker's own row (its recorded exits).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.utils import timezone

from tests.conftest import wait_for
from tests.support.fleet import wait_exit, wait_start, wait_workers_ready
from workers.models import WorkerExit, WorkerProcess
from workers.selectors.workers import worker_health
from workers.services.jobs import enqueue

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def status_of(name: str) -> tuple[str, str]:
    health = {w.name: w for w in worker_health(now=timezone.now())}
    return health[name].status, health[name].why


def exits_of(name: str) -> list[tuple[str, int]]:
    return [(e["exit"], e["pid"]) for e in WorkerProcess.objects.get(name=name).recent_exits]


def test_a_worker_restarted_after_crashes_is_crash_looping(processes, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_CRASH_LOOP_STARTS = 3
    # The workers' lease and heartbeat (worker_env), so this process reads their silence the same way.
    settings.KOALA_LEASE_SECONDS, settings.KOALA_HEARTBEAT_SECONDS = 3.0, 0.5
    killed = []
    for _ in range(3):
        worker = processes.worker("--name", "looping-w")
        wait_workers_ready([worker])
        worker.send_signal(signal.SIGKILL)
        wait_exit(worker, timeout=10)
        killed.append(worker.pid)
    row = WorkerProcess.objects.get(name="looping-w")
    assert len(row.recent_starts) == 3
    # Two deaths were found by the restarts; the third is inferred once its heartbeat expires.
    assert exits_of("looping-w") == [(WorkerExit.DIED, pid) for pid in killed[:2]]
    wait_for(lambda: status_of("looping-w")[0] == "crash_looping", timeout=10, what="the third death to be seen")
    status, why = status_of("looping-w")
    assert status == "crash_looping" and "3 abnormal exits" in why

    # A fourth start records the third death on the row, and it is counted once, not twice.
    survivor = processes.worker("--name", "looping-w")
    wait_workers_ready([survivor])
    assert exits_of("looping-w") == [(WorkerExit.DIED, pid) for pid in killed]
    status, why = status_of("looping-w")
    assert status == "crash_looping" and "3 abnormal exits" in why


def test_clean_stops_never_count_toward_a_crash_loop(processes, settings) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM and Ctrl-C (SIGINT) are how operators and service managers stop workers: many
    of them, under one fixed name or under fresh host.pid names, are not a crash loop."""
    settings.KOALA_CRASH_LOOP_STARTS = 3
    stopped = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
        worker = processes.worker("--name", "restarted-w")
        wait_workers_ready([worker])
        worker.send_signal(sig)
        assert wait_exit(worker, timeout=15) == 0
        stopped.append(worker.pid)
        row = WorkerProcess.objects.get(name="restarted-w")
        assert (row.pid, row.exit) == (worker.pid, WorkerExit.STOPPED) and row.stopped_at is not None
        assert status_of("restarted-w")[0] == "stopped"
    for _ in range(3):  # default names: one row per process, same host and queues
        worker = processes.worker()
        wait_workers_ready([worker])
        worker.send_signal(signal.SIGINT)
        assert wait_exit(worker, timeout=15) == 0
        assert WorkerProcess.objects.get(pid=worker.pid).exit == WorkerExit.STOPPED
    current = processes.worker("--name", "restarted-w")
    wait_workers_ready([current])

    assert exits_of("restarted-w") == [(WorkerExit.STOPPED, pid) for pid in stopped]
    health = {w.name: w.status for w in worker_health(now=timezone.now())}
    assert health.pop("restarted-w") == "idle"
    assert set(health.values()) == {"stopped"} and len(health) == 3, health


def test_a_live_worker_holding_one_attempt_too_long_is_stuck(processes, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_STUCK_AFTER_SECONDS = 1.0
    busy = processes.worker("--name", "stuck-w")
    idle = processes.worker("--name", "idle-w", "--queues", "bulk")
    wait_workers_ready([busy, idle])
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="probe", input={"log": log, "seconds": 30}).job_id
    wait_start(log, job_id)
    assert status_of("stuck-w")[0] == "healthy"  # running, not for long yet
    # Stuck once the attempt has run past KOALA_STUCK_AFTER_SECONDS of wall time, as it keeps running.
    wait_for(lambda: status_of("stuck-w")[0] == "stuck", timeout=10, what="the busy worker to count as stuck")
    status, why = status_of("stuck-w")
    assert status == "stuck" and "one attempt running" in why
    assert status_of("idle-w")[0] == "idle"  # alive, nothing due on its queue: not stuck, not a loop
    assert busy.poll() is None  # alive all along: stuck is not the same as dead


def test_a_live_worker_keeps_its_name(processes) -> None:  # type: ignore[no-untyped-def]
    first = processes.worker("--name", "unique-w")
    wait_workers_ready([first])
    before = WorkerProcess.objects.values().get(name="unique-w")
    clash = processes.worker("--name", "unique-w")
    assert wait_exit(clash, timeout=20) != 0  # a real clash is still refused
    assert first.poll() is None
    # ...and the refused process leaves the live worker's row alone: no exit recorded for a
    # worker that is running, nor the clash's pid or stop written over it.
    after = WorkerProcess.objects.values().get(name="unique-w")
    assert {k: after[k] for k in ("pid", "stopped_at", "exit", "recent_exits", "started_at")} == {
        k: before[k] for k in ("pid", "stopped_at", "exit", "recent_exits", "started_at")
    }
    assert status_of("unique-w")[0] == "idle"
