"""A worker that stops: the stop call ends its waiting acquire at once and records its exit.

Without it an idle HTTP worker waited out its open long-poll (up to a minute, the server's acquire
wait) after SIGTERM, and its exit was never recorded: systemd stops and deploys felt the first on
every worker, the dashboard the second. Measured here against a server whose acquire waits 60 s,
so a worker that stops in a few seconds can only have been answered by the stop call.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, wait_for
from tests.support.api_server import ApiServer, ProtocolWorker
from tests.support.fleet import attempts, wait_state
from tests.support.sdk import NODE_WORKER, SDK_SRC
from workers.models import Job, JobState, Outcome, WorkerExit, WorkerProcess
from workers.services import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # a live server reads the rows

# A stop the long-poll alone would take this long to notice: the server's acquire wait.
ACQUIRE_WAIT = 60
# Well under the long-poll (and the SDK's shutdown deadline): what "at once" must beat here.
PROMPT = 10.0


@pytest.fixture
def slow_poll_server(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path, env={"KOALA_API_ACQUIRE_WAIT_SECONDS": str(ACQUIRE_WAIT)})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def stop(worker: ProtocolWorker, reason: str = "tests") -> tuple[int, Any]:
    return worker.server.post(f"/api/v1/workers/{worker.worker_id}/stop", {"reason": reason}, key=worker.key)


def test_the_stop_call_answers_the_waiting_acquire_at_once_and_records_the_exit(
    slow_poll_server: ApiServer, worker_key: str
) -> None:
    worker = ProtocolWorker(slow_poll_server, worker_key, kinds=["http.probe@1"], name="stopper")
    answered: list[tuple[float, int]] = []

    def acquire() -> None:
        began = time.monotonic()
        status, _ = slow_poll_server.post(
            f"/api/v1/workers/{worker.worker_id}/acquire", {"max": 1, "wait_seconds": ACQUIRE_WAIT}, key=worker_key, timeout=90
        )
        answered.append((time.monotonic() - began, status))

    waiting = threading.Thread(target=acquire, daemon=True)
    waiting.start()
    wait_for(lambda: WorkerProcess.objects.filter(name="stopper").exists(), timeout=10, what="the registration")
    time.sleep(0.5)  # the acquire must be waiting in the server for the stop to have something to end
    status, body = stop(worker, "SIGTERM")
    assert (status, body) == (200, {"worker_id": "stopper", "held": 0, "exited": True})
    waiting.join(timeout=PROMPT)
    assert not waiting.is_alive(), "the waiting acquire was not answered"
    [(took, status)] = answered
    assert status == 204 and took < PROMPT
    row = WorkerProcess.objects.get(name="stopper")
    assert row.exit == WorkerExit.STOPPED and row.stopped_at is not None
    assert row.recent_exits[-1]["exit"] == "stopped" and row.recent_exits[-1]["detail"] == "SIGTERM"
    # A job that comes due now is not handed to the stopped worker: it no longer exists for the server.
    job_id = jobs.enqueue(kind="http.probe", version=1, input={}).job_id
    status, body = slow_poll_server.post(
        f"/api/v1/workers/{worker.worker_id}/acquire", {"max": 1, "wait_seconds": 0}, key=worker_key
    )
    assert (status, body["error"]) == (404, "unknown_worker")
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED


def test_a_worker_holding_a_lease_stops_acquiring_and_exits_when_it_has_reported(
    slow_poll_server: ApiServer, worker_key: str
) -> None:
    first = jobs.enqueue(kind="http.probe", version=1, input={"n": 1}).job_id
    worker = ProtocolWorker(slow_poll_server, worker_key, kinds=["http.probe@1"], name="busy")
    [lease] = worker.acquire(wait=5)
    assert lease["job_id"] == first
    assert stop(worker) == (200, {"worker_id": "busy", "held": 1, "exited": False})
    jobs.enqueue(kind="http.probe", version=1, input={"n": 2})
    began = time.monotonic()
    assert worker.acquire(wait=ACQUIRE_WAIT) == []  # answered at once, and nothing is handed out
    assert time.monotonic() - began < PROMPT
    assert WorkerProcess.objects.get(name="busy").exit == WorkerExit.RUNNING
    status, _ = worker.lease_call(lease, "complete", output={"done": True})
    assert status == 200
    assert stop(worker) == (200, {"worker_id": "busy", "held": 0, "exited": True})
    assert WorkerProcess.objects.get(name="busy").exit == WorkerExit.STOPPED
    # Registering again (a restart under the same name) serves as before.
    again = ProtocolWorker(slow_poll_server, worker_key, kinds=["http.probe@1"], name="busy")
    [second] = again.acquire(wait=5)
    assert second["input"] == {"n": 2}


def test_a_name_another_key_holds_is_refused_and_a_local_workers_name_too(
    slow_poll_server: ApiServer, worker_key: str, processes: Any
) -> None:
    from tests.support.api_server import make_key

    ProtocolWorker(slow_poll_server, worker_key, kinds=["http.probe@1"], name="taken")
    other = make_key("worker", name="another key")
    status, body = slow_poll_server.post("/api/v1/workers/register", {"name": "taken", "kinds": ["http.probe@1"]}, key=other)
    assert (status, body["error"]) == (403, "forbidden")
    local = processes.worker("--name", "local-1", name="local-1")
    wait_for(lambda: WorkerProcess.objects.filter(name="local-1", exit=WorkerExit.RUNNING).exists(), timeout=20)
    status, body = slow_poll_server.post(
        "/api/v1/workers/register", {"name": "local-1", "kinds": ["http.probe@1"]}, key=worker_key
    )
    assert (status, body["error"]) == (403, "forbidden"), "an HTTP key took over a running local worker's name"
    row = WorkerProcess.objects.get(name="local-1")
    assert (row.pid, row.api_key, row.exit) == (local.pid, "", WorkerExit.RUNNING)


SDK_PROCESS = """
import sys, time
sys.path.insert(0, {src!r})
from koala_worker import Client, Worker

def body(ctx, data):
    print("started", ctx.job_id, flush=True)
    time.sleep(float(data.get("seconds", 0)))   # ignores the stop: it finishes its work
    return {{"slept": data.get("seconds", 0)}}

Worker(Client({url!r}, {key!r}, timeout=10), concurrency=2, name={name!r}, shutdown_deadline=30).register(
    "http.probe", 1, body
).serve()
print("stopped", flush=True)
"""


def sdk_process(server: ApiServer, key: str, tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    script = SDK_PROCESS.format(src=str(SDK_SRC), url=server.url, key=key, name=name)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def terminate(proc: subprocess.Popen[bytes], log: Path) -> float:
    """SIGTERM, then the seconds until the process exited (0, as a clean stop)."""
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return time.monotonic() - began


def registered(name: str) -> bool:
    return WorkerProcess.objects.filter(name=name, exit=WorkerExit.RUNNING).exists()


def test_an_idle_sdk_worker_stops_at_once_and_records_its_exit(
    slow_poll_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    proc, log = sdk_process(slow_poll_server, worker_key, tmp_path, "sdk-idle")
    wait_for(lambda: registered("sdk-idle"), timeout=20, what="the SDK worker to register")
    time.sleep(0.5)  # its first long-poll is open by now: the stop must end it
    took = terminate(proc, log)
    assert took < PROMPT, f"an idle worker took {took:.1f}s to stop (its long-poll waits {ACQUIRE_WAIT}s)"
    assert "stopped" in log.read_text()
    row = WorkerProcess.objects.get(name="sdk-idle")
    assert row.exit == WorkerExit.STOPPED and row.recent_exits[-1]["detail"] == "SIGTERM"


def test_a_busy_sdk_worker_stops_once_its_body_has_finished(slow_poll_server: ApiServer, worker_key: str, tmp_path: Path) -> None:
    job_id = jobs.enqueue(kind="http.probe", version=1, input={"seconds": 2}).job_id
    proc, log = sdk_process(slow_poll_server, worker_key, tmp_path, "sdk-busy")
    wait_for(lambda: f"started {job_id}" in log.read_text(), timeout=20, what="the body to start")
    took = terminate(proc, log)
    assert took < PROMPT, f"a busy worker took {took:.1f}s to stop after a 2 s body (its deadline is 30 s)"
    row = Job.objects.get(pk=job_id)
    assert (row.state, row.result) == (JobState.SUCCEEDED, {"slept": 2})
    assert [a.outcome for a in attempts(job_id)] == [Outcome.SUCCEEDED]
    assert WorkerProcess.objects.get(name="sdk-busy").exit == WorkerExit.STOPPED


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_node_example_stops_at_once_and_records_its_exit(
    slow_poll_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    log = tmp_path / "node.log"
    env = {
        **os.environ,
        "KOALA_URL": slow_poll_server.url,
        "KOALA_API_KEY": worker_key,
        "KOALA_KINDS": "http.probe@1",
        "KOALA_WORKER_NAME": "node-stop",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(["node", str(NODE_WORKER)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: registered("node-stop"), timeout=20, what="the Node worker to register")
    job_id = jobs.enqueue(kind="http.probe", version=1, input={}).job_id
    wait_state(job_id, JobState.SUCCEEDED, timeout=20)  # its long-poll is open again after this job
    took = terminate(proc, log)
    assert took < PROMPT, log.read_text()
    row = WorkerProcess.objects.get(name="node-stop")
    assert row.exit == WorkerExit.STOPPED and row.recent_exits[-1]["detail"] == "SIGTERM", log.read_text()
