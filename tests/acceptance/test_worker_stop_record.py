"""Scenario 9.6: a worker whose stdout/stderr is gone still records its stop.

`make run | tee log` then Ctrl-C: the terminal's SIGINT kills tee and reaches koala_run,
whose next write to the gone pipe fails. The workers must still stop gracefully and their
WorkerProcess rows must say so (a clean stop, not a death found later), or the next run
shows them as lost and a restart loop of clean stops looks like a crash loop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for, worker_env
from tests.support.fleet import attempts, ends, free_port, job, wait_exit, wait_start, wait_workers_ready
from workers.models import Outcome, WorkerExit, WorkerProcess
from workers.services.jobs import enqueue

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def start_into_pipe(processes, *args: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:  # type: ignore[no-untyped-def]
    """Start manage.py with stdout and stderr to a pipe (as `2>&1 | tee log`); returns the read end."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=env, stdout=write_end, stderr=write_end
    )
    os.close(write_end)
    processes.procs.append(proc)  # killed at teardown whatever happens
    return proc, read_end


@pytest.mark.parametrize(("sig", "worker_class"), [(signal.SIGINT, "simple"), (signal.SIGTERM, "fork")])
def test_a_worker_whose_output_pipe_is_gone_records_its_clean_stop(
    processes, tmp_path: Path, stray_pids, sig: int, worker_class: str
) -> None:  # type: ignore[no-untyped-def]
    log = str(tmp_path / "effects.log")
    worker, read_end = start_into_pipe(
        processes, "koala_worker", "--queues", "default", "--name", "piped-w", "--worker-class", worker_class, env=worker_env()
    )
    wait_workers_ready([worker])
    # A body that logs its way through the stop: it finishes after the signal, within the deadline.
    job_id = enqueue(kind="probe", input={"log": log, "seconds": 1.0, "cooperative": False}).job_id
    stray_pids.append(int(wait_start(log, job_id)[0][3]))
    os.close(read_end)  # the reader (tee) is gone: every later write to stdout/stderr fails
    worker.send_signal(sig)
    assert wait_exit(worker, timeout=15) == 0

    row = WorkerProcess.objects.get(name="piped-w")
    assert (row.pid, row.exit) == (worker.pid, WorkerExit.STOPPED) and row.stopped_at is not None
    assert [(e["exit"], e["pid"]) for e in row.recent_exits] == [(WorkerExit.STOPPED, worker.pid)]
    assert job(job_id).state == "succeeded" and [t.outcome for t in attempts(job_id)] == [Outcome.SUCCEEDED]
    assert len(ends(log, job_id)) == 1  # the body ran to its end, once


def test_ctrl_c_on_koala_run_piped_into_tee_still_records_the_workers_stop(processes, tmp_path: Path, stray_pids) -> None:  # type: ignore[no-untyped-def]
    env = worker_env(DEBUG="true")
    run, read_end = start_into_pipe(processes, "koala_run", "--no-demo", "--no-sandbox", "--port", str(free_port()), env=env)
    # koala_run's worker: registered and not stopped (its children are not ours to name).
    row = wait_for(
        lambda: WorkerProcess.objects.filter(stopped_at__isnull=True).first(), timeout=60, what="koala_run's worker to start"
    )
    assert isinstance(row, WorkerProcess)
    wait_workers_ready([_Pid(row.pid)])
    # Ctrl-C in the terminal: SIGINT to the foreground group, which kills tee and reaches
    # koala_run (its children run in their own process groups and hear it from koala_run).
    os.close(read_end)
    run.send_signal(signal.SIGINT)
    assert wait_exit(run, timeout=60) == 0  # a clean Ctrl-C, output or not

    row.refresh_from_db()
    assert row.exit == WorkerExit.STOPPED and row.stopped_at is not None, (row.exit, row.stopped_at)


class _Pid:
    """A process we did not start ourselves, as wait_workers_ready expects it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -1
        return None
