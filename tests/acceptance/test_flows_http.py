"""Workflow runs served over HTTP: a real uvicorn process (tests.support.api_server: lease 3 s,
heartbeat 0.5 s), SDK worker processes (tests/support/flow_worker.py), the beat and RQ workers
as real processes; runs started, read, signalled and cancelled through the run calls.

Asserted on rows and on the effect file the step bodies append to (the outside world's record of
how many times each body ran). Definitions: ``hfan``, ``hmix``, ``hwait`` in tests/flows_kinds.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from koala_worker import ApiError, Client

from flows.models import Run, RunStep, Signal
from tests.conftest import REPO, Processes, wait_for
from tests.kinds import effect_lines
from tests.support.api_server import ApiServer, ProtocolWorker, make_key
from tests.support.sdk import SDK_SRC
from workers.models import Attempt, Job, JobState, WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # a uvicorn subprocess reads the rows

FLOW_WORKER = REPO / "tests" / "support" / "flow_worker.py"


class SdkWorkers:
    """SDK worker processes, killed (by their own pids) however the test ends."""

    def __init__(self, server: ApiServer, key: str, tmp_path: Path) -> None:
        self.server, self.key, self.tmp_path = server, key, tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *serve: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(SDK_SRC)}
        args = [sys.executable, str(FLOW_WORKER), "--url", self.server.url, "--key", self.key, "--name", name]
        for item in serve:
            args += ["--serve", item]
        log = open(self.tmp_path / f"sdk-{name}.log", "wb")
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        wait_for(
            lambda: WorkerProcess.objects.filter(name=name, stopped_at__isnull=True).exists() or proc.poll() is not None,
            what=f"SDK worker {name} to register",
        )
        assert proc.poll() is None, (self.tmp_path / f"sdk-{name}.log").read_text()
        return proc

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def sdk_workers(api_server: ApiServer, worker_key: str, tmp_path: Path) -> Iterator[SdkWorkers]:
    workers = SdkWorkers(api_server, worker_key, tmp_path)
    try:
        yield workers
    finally:
        workers.stop_all()


@pytest.fixture
def runs(api_server: ApiServer, execute_key: str) -> Client:
    return Client(api_server.url, execute_key, timeout=10)


def _lines(log: Path) -> list[list[str]]:
    return effect_lines(str(log))


def _ended(runs: Client, run_id: int) -> dict[str, Any] | None:
    run = runs.get_run(run_id)
    return run if run["state"] in ("succeeded", "failed", "cancelled") else None


def _finish(runs: Client, run_id: int, timeout: float = 60) -> dict[str, Any]:
    done = wait_for(lambda: _ended(runs, run_id), timeout=timeout, what=f"run {run_id} to end")
    assert isinstance(done, dict)
    return done


def _steps(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in run["steps"]}


def test_a_fan_out_fan_in_run_on_two_sdk_worker_processes(sdk_workers: SdkWorkers, runs: Client, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    sdk_workers.start("hw1", "hfan@1")
    sdk_workers.start("hw2", "hfan@1")
    started = runs.start_run("hfan", {"log": str(log), "pause": {"b": 0.5, "c": 0.5}}, idempotency_key="fan-1", version=1)
    assert started["created"] is True and started["version"] == 1
    again = runs.start_run("hfan", {"log": str(log), "pause": {"b": 0.5, "c": 0.5}}, idempotency_key="fan-1", version=1)
    assert again["run_id"] == started["run_id"] and again["created"] is False
    run = _finish(runs, started["run_id"])
    assert run["state"] == "succeeded", run
    assert sorted(line[0] for line in _lines(log)) == ["a", "b", "c", "d"]  # each body once
    # Top-level keys merged: b and c each added theirs; the last "stage" is d's.
    assert run["run_state"] == {"stage": "d", "a": 1, "b": 1, "c": 1, "d": 1}
    steps = _steps(run)
    a_out = steps["a"]["output"]
    assert a_out["seen"] == {} and a_out["state"] == {} and a_out["run"]["id"] == run["run_id"]
    for sibling in ("b", "c"):  # each saw a's output, and the state as a left it
        assert steps[sibling]["output"]["seen"] == {"a": a_out}
        assert steps[sibling]["output"]["state"] == {"stage": "a", "a": 1}
    d_out = steps["d"]["output"]
    assert set(d_out["seen"]) == {"a", "b", "c"} and d_out["seen"]["b"]["step"] == "b"
    assert d_out["state"]["b"] == 1 and d_out["state"]["c"] == 1
    assert d_out["key"] == f"koala-run-{run['run_id']}-d"  # the step's key, stable across its retries
    # The run read answers which worker ran each step.
    assert {name: step["worker_ids"] for name, step in steps.items()}.keys() == {"a", "b", "c", "d"}
    assert all(len(step["worker_ids"]) == 1 and step["worker_ids"][0] in ("hw1", "hw2") for step in steps.values())
    assert Job.objects.filter(run_id=run["run_id"]).count() == 4


def test_a_mixed_run_one_step_on_an_rq_worker_the_others_on_http_workers(
    processes: Processes, sdk_workers: SdkWorkers, runs: Client, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    rq = processes.worker("--name", "hmix-rq", "--worker-class", "simple")
    sdk_workers.start("hmix-http", "hmix@1:b,c,d")
    wait_for(lambda: WorkerProcess.objects.filter(name="hmix-rq", stopped_at__isnull=True).exists(), what="the RQ worker")
    run = _finish(runs, runs.start_run("hmix", {"log": str(log)})["run_id"])
    assert run["state"] == "succeeded", run
    steps = _steps(run)
    assert steps["a"]["worker_ids"] == ["hmix-rq"]
    assert all(steps[s]["worker_ids"] == ["hmix-http"] for s in "bcd")
    lines = _lines(log)
    assert sorted(line[0] for line in lines) == ["a", "b", "c", "d"]
    assert steps["a"]["output"]["pid"] != sdk_workers.procs["hmix-http"].pid and rq.poll() is None
    for sibling in ("b", "c"):
        assert steps[sibling]["output"]["seen"] == {"a": steps["a"]["output"]}
        assert steps[sibling]["output"]["state"] == {"stage": "a", "a": 1, "runtime": "rq"}
    assert set(steps["d"]["output"]["seen"]) == {"a", "b", "c"}
    assert run["run_state"] == {"stage": "d", "a": 1, "runtime": "rq", "b": 1, "c": 1, "d": 1}


def test_kill_9_of_an_sdk_worker_mid_step_is_reclaimed_and_each_step_ends_once(
    processes: Processes, sdk_workers: SdkWorkers, runs: Client, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    processes.beat()  # the reaper: an expired lease is orphaned, then requeued (at_least_once)
    first = sdk_workers.start("hk1", "hfan@1")
    run_id = runs.start_run("hfan", {"log": str(log), "hold": {"b": 30}}, version=1)["run_id"]
    wait_for(lambda: any(line[0] == "b" for line in _lines(log)), timeout=30, what="b to start")
    b_line = next(line for line in _lines(log) if line[0] == "b")
    assert b_line[5] == "hk1"
    # c runs beside b: kill only once c's end is recorded, so the kill lands in b alone (a c still
    # in flight would rightly run again, at least once, and the counts below would not be exact).
    wait_for(lambda: RunStep.objects.filter(run_id=run_id, name="c", state="succeeded").exists(), timeout=30, what="c to end")
    first.kill()  # kill -9 mid-step: no report, no stop call
    first.wait(timeout=10)
    # The other worker takes b once the lease is reclaimed (``hold`` pauses a first attempt only).
    sdk_workers.start("hk2", "hfan@1")
    run = _finish(runs, run_id, timeout=90)
    assert run["state"] == "succeeded", run
    ran = [line[0] for line in _lines(log)]
    assert (ran.count("a"), ran.count("c"), ran.count("d"), ran.count("b")) == (1, 1, 1, 2)
    assert {s: Job.objects.filter(run_id=run_id, step=s).count() for s in "abcd"} == dict.fromkeys("abcd", 1)
    b_job = Job.objects.get(run_id=run_id, step="b")
    assert [a.outcome for a in Attempt.objects.filter(job=b_job).order_by("number")] == ["orphaned", "succeeded"]
    assert _steps(run)["b"]["worker_ids"] == ["hk1", "hk2"]
    # b's delta merged once, by its second attempt; the fan-in once.
    assert run["run_state"]["b"] == 2 and _steps(run)["d"]["output"]["seen"]["b"]["step"] == "b"
    assert RunStep.objects.get(run_id=run_id, name="d").state == "succeeded"


def test_two_http_workers_race_one_step_the_fence_picks_one_and_the_loser_changes_nothing(
    processes: Processes, api_server: ApiServer, worker_key: str, runs: Client, tmp_path: Path
) -> None:
    processes.beat()
    w1 = ProtocolWorker(api_server, worker_key, kinds=[{"name": "hfan", "version": 1, "steps": ["a"]}], name="race-1")
    w2 = ProtocolWorker(api_server, worker_key, kinds=[{"name": "hfan", "version": 1, "steps": ["a"]}], name="race-2")
    run_id = runs.start_run("hfan", {"log": str(tmp_path / "x.log")}, version=1)["run_id"]
    [first] = w1.acquire()
    # The lease carries the step's correlation, over HTTP.
    assert (first["kind"], first["step"], first["steps"], first["state"]) == ("hfan.a", "a", {}, {})
    assert first["run"]["id"] == run_id and first["idempotency_key"] == f"koala-run-{run_id}-a"
    assert first["trace_id"] == Run.objects.get(pk=run_id).trace_id and len(first["span_id"]) == 16
    # w1 goes quiet; the reaper reclaims the lease and w2 takes the step.
    [second] = wait_for(lambda: w2.acquire(wait=2), timeout=30, what="w2 to get the reclaimed step")  # type: ignore[misc]
    assert second["job_id"] == first["job_id"] and second["lease_id"] != first["lease_id"]
    # Each attempt is its own span of the run's trace: the reclaim is a new one, never a duplicate.
    assert second["span_id"] != first["span_id"] and second["trace_id"] == first["trace_id"]
    status, body = w2.lease_call(second, "complete", output={"by": "w2"}, state_delta={"winner": "w2"})
    assert (status, body) == (200, {"outcome": "succeeded"})
    before = Run.objects.get(pk=run_id)
    status, body = w1.lease_call(first, "complete", output={"by": "w1"}, state_delta={"winner": "w1"})
    assert status == 409 and body["error"] == "lease_superseded", body
    after = Run.objects.get(pk=run_id)
    assert after.run_state == before.run_state == {"winner": "w2"}
    assert RunStep.objects.get(run_id=run_id, name="a").output == {"by": "w2"}


def test_signals_over_http_buffered_before_the_wait_consumed_once_duplicate_then_rejected(
    sdk_workers: SdkWorkers, runs: Client, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    sdk_workers.start("hs1", "hwait@1:work,finish")
    run_id = runs.start_run("hwait", {"log": str(log), "pause": {"work": 1}})["run_id"]
    assert runs.signal(run_id, "go", key="review-1", payload={"approved": True}) == "buffered"  # before the wait
    assert runs.signal(run_id, "go", key="review-1", payload={"approved": False}) == "duplicate"
    run = _finish(runs, run_id)
    assert run["state"] == "succeeded", run
    steps = _steps(run)
    assert steps["gate"]["output"] == {"approved": True}
    assert steps["finish"]["output"]["seen"]["gate"] == {"approved": True}
    [signal] = Signal.objects.filter(run_id=run_id)
    assert (signal.status, signal.consumed_by) == ("consumed", "gate")
    assert [line[0] for line in _lines(log)] == ["work", "finish"]
    assert runs.signal(run_id, "go", key="review-2") == "rejected"  # a finished run
    assert Signal.objects.filter(run_id=run_id).count() == 1


def test_cancel_over_http_mid_step_the_heartbeat_hears_job_cancelled_and_a_late_completion_is_refused(
    api_server: ApiServer, worker_key: str, runs: Client, tmp_path: Path
) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=[{"name": "hwait", "version": 1, "steps": ["work"]}], name="cw")
    run_id = runs.start_run("hwait", {"log": str(tmp_path / "x.log")})["run_id"]
    [lease] = worker.acquire()
    assert worker.lease_call(lease, "heartbeat")[0] == 200
    assert runs.cancel_run(run_id, reason="customer withdrew") == {"run_id": run_id, "state": "cancelled"}
    status, body = wait_for(  # type: ignore[misc]
        lambda: (answer := worker.lease_call(lease, "heartbeat"))[0] == 409 and answer, what="the heartbeat to hear it"
    )
    assert body["error"] == "job_cancelled"
    before = Run.objects.get(pk=run_id)
    status, body = worker.lease_call(lease, "complete", output={"late": True}, state_delta={"late": True})
    assert (status, body["error"]) == (409, "job_cancelled")
    after = Run.objects.get(pk=run_id)
    assert (after.state, after.run_state) == ("cancelled", before.run_state) == ("cancelled", {})
    assert RunStep.objects.get(run_id=run_id, name="work").output is None
    assert Job.objects.get(pk=lease["job_id"]).state == JobState.CANCELLED
    with pytest.raises(ApiError) as refused:
        runs.cancel_run(run_id)
    assert (refused.value.status, refused.value.code) == (400, "run_finished")


def test_the_run_version_a_worker_lacks_is_not_leased_and_unservable_uses_no_attempt(
    api_server: ApiServer, worker_key: str, runs: Client, tmp_path: Path
) -> None:
    run_id = runs.start_run("hfan", {"log": str(tmp_path / "x.log")}, version=1)["run_id"]
    newer = ProtocolWorker(api_server, worker_key, kinds=[{"name": "hfan", "version": 2, "steps": ["a"]}], name="v2-only")
    assert newer.acquire(wait=1) == []  # it serves hfan@2 only: the v1 step is not its
    lacking = ProtocolWorker(api_server, worker_key, kinds=[{"name": "hfan", "version": 1, "steps": ["a"]}], name="v1-lacks")
    [lease] = lacking.acquire()
    status, body = lacking.lease_call(
        lease, "fail", classification="unservable", error_class="Unservable", message="no body for hfan.a@1", body_started=False
    )
    assert (status, body) == (200, {"outcome": "unservable"}), body
    job = Job.objects.get(pk=lease["job_id"])
    assert job.state == JobState.QUEUED and job.attempts == 0  # back to the queue, no attempt used
    assert Run.objects.get(pk=run_id).state == "running"


def test_register_names_what_it_does_not_know_and_the_scopes_hold(
    api_server: ApiServer, worker_key: str, execute_key: str, runs: Client
) -> None:
    count = WorkerProcess.objects.count()
    for kinds, code in (
        ([{"name": "hfan", "version": 1, "steps": ["zz"]}], "unknown_step"),
        ([{"name": "hwait", "version": 1, "steps": ["gate"]}], "unknown_step"),  # a wait: no worker serves it
        ([{"name": "hfan", "version": 7, "steps": ["a"]}], "unknown_version"),
        ([{"name": "nope", "version": 1, "steps": ["a"]}], "unknown_kind"),
    ):
        status, body = api_server.post("/api/v1/workers/register", {"name": "bad", "kinds": kinds}, key=worker_key)
        assert (status, body["error"]) == (400, code), body
    assert WorkerProcess.objects.count() == count
    status, body = api_server.post(
        "/api/v1/workers/register", {"name": "ok", "kinds": [{"name": "hfan", "version": 1, "steps": ["a", "b"]}]}, key=worker_key
    )
    assert status == 200 and body["kinds"] == ["hfan.a@1", "hfan.b@1"], body
    # A worker-only key cannot start runs; an execute-only key cannot register or acquire.
    with pytest.raises(ApiError) as refused:
        Client(api_server.url, worker_key).start_run("hfan", {"log": "x"}, version=1)
    assert (refused.value.status, refused.value.code) == (403, "forbidden")
    assert Run.objects.count() == 0
    status, body = api_server.post("/api/v1/workers/register", {"kinds": ["hfan.a@1"]}, key=execute_key)
    assert (status, body["error"]) == (403, "forbidden")
    status, body = api_server.post("/api/v1/workers/ok/acquire", {"max": 1, "wait_seconds": 0}, key=execute_key)
    assert (status, body["error"]) == (403, "forbidden")
    both = make_key("write", name="both")
    assert Client(api_server.url, both).start_run("hfan", {"log": "x"}, version=1)["created"] is True
