"""R3 with real worker processes: the dashboard tells a crash loop from a stuck worker.

A crash loop is many starts with short lives (here: one worker name restarted after
kill -9, as a service manager would); a stuck worker is alive, heartbeating, yet makes
no progress. Both are read from the same function the dashboard renders.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.utils import timezone

from console.dashboard import worker_health
from tests.acceptance.support import wait_exit, wait_start, wait_workers_ready
from workers.models import WorkerProcess
from workers.services.jobs import enqueue

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def status_of(name: str) -> tuple[str, str]:
    health = {w.name: w for w in worker_health(now=timezone.now())}
    return health[name].status, health[name].why


def test_a_worker_restarted_after_crashes_is_crash_looping(processes, settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_CRASH_LOOP_STARTS = 3
    for _ in range(3):
        worker = processes.worker("--name", "looping-w")
        wait_workers_ready([worker])
        worker.send_signal(signal.SIGKILL)
        wait_exit(worker, timeout=10)
    row = WorkerProcess.objects.get(name="looping-w")
    assert len(row.recent_starts) == 3
    status, why = status_of("looping-w")
    assert status == "crash_looping" and "3 starts" in why


def test_a_live_worker_holding_one_attempt_too_long_is_stuck(processes, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_STUCK_AFTER_SECONDS = 1.0
    busy = processes.worker("--name", "stuck-w")
    idle = processes.worker("--name", "idle-w", "--queues", "bulk")
    wait_workers_ready([busy, idle])
    log = str(tmp_path / "effects.log")
    job_id = enqueue(kind="probe", input={"log": log, "seconds": 30}).job_id
    wait_start(log, job_id)
    assert status_of("stuck-w")[0] == "healthy"  # running, not for long yet
    time.sleep(1.5)
    status, why = status_of("stuck-w")
    assert status == "stuck" and "one attempt running" in why
    assert status_of("idle-w")[0] == "idle"  # alive, nothing due on its queue: not stuck, not a loop
    assert busy.poll() is None  # alive all along: stuck is not the same as dead


def test_a_live_worker_keeps_its_name(processes) -> None:  # type: ignore[no-untyped-def]
    first = processes.worker("--name", "unique-w")
    wait_workers_ready([first])
    clash = processes.worker("--name", "unique-w")
    assert wait_exit(clash, timeout=20) != 0  # a real clash is still refused
    assert first.poll() is None
