"""Faults of HTTP workers against a real uvicorn process: kill -9, SIGSTOP past the lease, repeated
reports, RQ and HTTP workers on one queue, and the ledger's calls under budgets, pauses and review.

HTTP workers are real subprocesses (tests/support/http_worker.py) or a ProtocolWorker driven by
the test; the reaper is a real ``koala_beat``. Assertions use rows and effect lines (the outside
world's record), never logs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reviews.models import ReviewRequest
from tests.conftest import REPO, Processes, wait_for, worker_env
from tests.kinds import effect_lines
from tests.support.api_server import ApiServer, ProtocolWorker
from tests.support.fleet import (
    assert_engine_invariants,
    attempts,
    ends,
    job,
    snapshot,
    starts,
    wait_all_terminal,
    wait_start,
    wait_state,
    wait_workers_ready,
)
from workers.models import Attempt, FailureReason, Job, JobState, Operation, OperationState, Outcome, ParkReason, WorkerProcess
from workers.services import budgets, jobs, pauses

# Other connections must see the rows: a live server, worker and beat subprocesses.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # a uvicorn subprocess, worker processes


def enqueue(kind: str = "http.probe", version: int = 1, **data: Any) -> int:
    return jobs.enqueue(kind=kind, version=version, input=data).job_id


def http_worker(
    processes: Processes, server: ApiServer, key: str, *, name: str, kinds: str, log: Path, concurrency: int = 1
) -> subprocess.Popen[bytes]:
    """tests/support/http_worker.py as a subprocess, owned by ``processes`` (killed at the end)."""
    out = open(processes.tmp_path / f"{name}.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.http_worker",
            "--url",
            server.url,
            "--key",
            key,
            "--kinds",
            kinds,
            "--name",
            name,
            "--concurrency",
            str(concurrency),
            "--log",
            str(log),
            "--wait",
            "5",
        ],
        cwd=REPO,
        env=worker_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    processes.procs.append(proc)
    wait_for(
        lambda: proc.poll() is not None or WorkerProcess.objects.filter(name=name, pid=proc.pid).exists(),
        what=f"http worker {name} to register",
    )
    assert proc.poll() is None, f"http worker {name} exited with {proc.returncode}"
    return proc


def dropped(log: Path, job_id: int) -> list[list[str]]:
    return [line for line in effect_lines(str(log)) if line[:2] == ["dropped", str(job_id)]]


# -- 1. kill -9 mid-body ------------------------------------------------------------------------


def test_killed_http_worker_at_least_once_reruns_on_another_worker(
    api_server: ApiServer, worker_key: str, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    first = http_worker(processes, api_server, worker_key, name="h-first", kinds="http.probe@1", log=log)
    job_id = enqueue(log=str(log), first_seconds=120, seconds=0)
    (start,) = wait_start(log, job_id)
    assert start[3] == str(first.pid)
    first.kill()
    first.wait(timeout=10)

    processes.beat()
    second = http_worker(processes, api_server, worker_key, name="h-second", kinds="http.probe@1", log=log)
    row = wait_state(job_id, JobState.SUCCEEDED, timeout=30)
    assert [line[3] for line in starts(log, job_id)] == [str(first.pid), str(second.pid)]
    assert [line[3] for line in ends(log, job_id)] == [str(second.pid)]
    tries = attempts(job_id)
    assert [(a.outcome, a.worker_id) for a in tries] == [(Outcome.ORPHANED, "h-first"), (Outcome.SUCCEEDED, "h-second")]
    assert row.result == {"pid": second.pid, "worker": "h-second"}
    assert_engine_invariants()


def test_killed_http_worker_at_most_once_fails_orphaned_and_never_reruns(
    api_server: ApiServer, worker_key: str, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    first = http_worker(processes, api_server, worker_key, name="o-first", kinds="http.once@1", log=log)
    job_id = enqueue("http.once", log=str(log), first_seconds=120, seconds=0)
    wait_start(log, job_id)
    first.kill()
    first.wait(timeout=10)

    # A second worker serving the kind is waiting the whole time: it would take a requeued job.
    http_worker(processes, api_server, worker_key, name="o-second", kinds="http.once@1", log=log)
    processes.beat()
    row = wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED, timeout=30)
    assert row.state == JobState.FAILED and row.failure_reason == FailureReason.ORPHANED
    # Proof that the second worker was serving: a later job of the kind runs there.
    marker = enqueue("http.once", log=str(log))
    wait_state(marker, JobState.SUCCEEDED, timeout=30)
    assert len(starts(log, job_id)) == 1 and ends(log, job_id) == []
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED]
    assert_engine_invariants()


# -- 2. a worker paused past its lease while another takes the job over ---------------------------


def test_sigstopped_http_worker_is_superseded_and_cannot_change_the_outcome(
    api_server: ApiServer, worker_key: str, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    stale = http_worker(processes, api_server, worker_key, name="s-stale", kinds="http.probe@1", log=log)
    job_id = enqueue(log=str(log), first_seconds=120, seconds=0)
    wait_start(log, job_id)
    os.kill(stale.pid, signal.SIGSTOP)  # no heartbeats from here on: the lease runs out
    try:
        processes.beat()
        fresh = http_worker(processes, api_server, worker_key, name="s-fresh", kinds="http.probe@1", log=log)
        wait_state(job_id, JobState.SUCCEEDED, timeout=30)
        before = snapshot(job_id)
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    # Its next heartbeat is refused by name, and the body stops without reporting.
    wait_for(lambda: dropped(log, job_id), timeout=20, what="the stale worker to be told it was superseded")
    assert dropped(log, job_id) == [["dropped", str(job_id), "1", "lease_superseded"]]
    assert snapshot(job_id) == before
    assert [line[3] for line in ends(log, job_id)] == [str(fresh.pid)]
    assert [(a.outcome, a.worker_id) for a in attempts(job_id)] == [(Outcome.ORPHANED, "s-stale"), (Outcome.SUCCEEDED, "s-fresh")]
    assert job(job_id).result == {"pid": fresh.pid, "worker": "s-fresh"}
    assert_engine_invariants()


def test_every_call_on_a_superseded_lease_is_refused_and_changes_nothing(
    api_server: ApiServer, worker_key: str, processes: Processes
) -> None:
    stale = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="p-stale")
    fresh = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="p-fresh")
    job_id = enqueue()
    (old,) = stale.acquire()
    processes.beat()  # the stale side sends no heartbeat: the reaper requeues the job
    (new,) = fresh.acquire(wait=10)
    assert new["job_id"] == job_id and new["attempt"] == 2
    status, body = stale.lease_call(old, "heartbeat")
    assert (status, body["error"]) == (409, "lease_superseded")
    assert fresh.lease_call(new, "complete", output={"by": "fresh"})[0] == 200
    before = snapshot(job_id)
    for what, fields in [
        ("heartbeat", {"progress": {"page": 9}}),
        ("complete", {"output": {"by": "stale"}}),
        ("fail", {"classification": "fatal", "message": "stale"}),
        ("operations", {"name": "charge", "kind": "charge", "params": {"n": 1}}),
    ]:
        status, body = stale.lease_call(old, what, **fields)
        assert (status, body["error"]) == (409, "lease_superseded"), (what, body)
    assert snapshot(job_id) == before
    assert job(job_id).result == {"by": "fresh"}
    assert not Operation.objects.filter(job_id=job_id).exists()


# -- 3. repeated reports ----------------------------------------------------------------------------


def test_a_repeated_completion_is_already_recorded_and_changes_nothing(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="d-1")
    job_id = enqueue()
    (lease,) = worker.acquire()
    assert worker.lease_call(lease, "complete", output={"n": 1})[0] == 200
    before = snapshot(job_id)
    # The same report again (a lost reply), and a "repeat" that differs: the first one stands.
    for output in ({"n": 1}, {"n": 2}):
        status, body = worker.lease_call(lease, "complete", output=output)
        assert (status, body["error"]) == (409, "already_recorded"), body
    assert snapshot(job_id) == before
    assert job(job_id).result == {"n": 1}


def test_a_repeated_terminal_fail_is_already_recorded_and_changes_nothing(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="d-2")
    job_id = enqueue()
    (lease,) = worker.acquire()
    assert worker.lease_call(lease, "fail", classification="step_failure", error_class="Bad", message="no")[0] == 200
    before = snapshot(job_id)
    status, body = worker.lease_call(lease, "fail", classification="step_failure", error_class="Bad", message="no")
    assert (status, body["error"]) == (409, "already_recorded"), body
    assert snapshot(job_id) == before
    assert job(job_id).state == JobState.FAILED and job(job_id).error_class == "Bad"


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (("complete", {"output": {"n": 1}}), ("fail", {"classification": "retryable", "message": "late"})),
        (("complete", {"output": {"n": 1}}), ("fail", {"classification": "released"})),
        (("fail", {"classification": "step_failure", "message": "no"}), ("complete", {"output": 1})),
    ],
)
def test_another_report_after_the_lease_ended_is_already_recorded(
    api_server: ApiServer, worker_key: str, first: tuple[str, dict[str, Any]], then: tuple[str, dict[str, Any]]
) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="d-3")
    job_id = enqueue()
    (lease,) = worker.acquire()
    assert worker.lease_call(lease, first[0], **first[1])[0] == 200
    before = snapshot(job_id)
    status, body = worker.lease_call(lease, then[0], **then[1])
    assert snapshot(job_id) == before
    assert (status, body["error"]) == (409, "already_recorded"), body


# -- 4. RQ and HTTP workers drain one queue together -------------------------------------------------


def test_rq_and_http_workers_drain_one_queue_together(
    api_server: ApiServer, worker_key: str, processes: Processes, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    rq = [processes.worker(name="rq-a"), processes.worker(name="rq-b")]
    wait_workers_ready(rq)
    for name in ("mix-1", "mix-2"):
        http_worker(processes, api_server, worker_key, name=name, kinds="probe@1", log=log, concurrency=4)
    ids = [enqueue("probe", log=str(log), seconds=0.05) for _ in range(200)]
    wait_all_terminal(ids, timeout=120)
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {JobState.SUCCEEDED}
    per_job: dict[str, int] = {}
    for line in starts(log):
        per_job[line[1]] = per_job.get(line[1], 0) + 1
    assert per_job == {str(i): 1 for i in ids}
    assert len(ends(log)) == len(ids)
    rq_names = set(WorkerProcess.objects.filter(pid__in=[p.pid for p in rq]).values_list("name", flat=True))
    ran = set(Attempt.objects.filter(job_id__in=ids, outcome=Outcome.SUCCEEDED).values_list("worker_id", flat=True))
    assert ran & {"mix-1", "mix-2"}, ran
    assert ran & rq_names, (ran, rq_names)
    assert ran <= rq_names | {"mix-1", "mix-2"}
    assert_engine_invariants()


# -- 5. the ledger over HTTP: budgets, pauses, review --------------------------------------------


def charge(amount: int, customer: str = "c_1") -> dict[str, Any]:
    return {
        "name": "charge",
        "kind": "charge",
        "params": {"amount": amount, "customer": customer},
        "amount_minor": amount,
        "currency": "EUR",
        "target": customer,
        "estimate_minor": amount,
        "can_look_up": True,
    }


def test_operation_sent_once_and_done_on_the_rerun_after_reclaim(
    api_server: ApiServer, worker_key: str, processes: Processes
) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.charge@1"], name="op-a")
    job_id = enqueue("http.charge", amount=500)
    (lease,) = worker.acquire()
    status, begun = worker.lease_call(lease, "operations", **charge(500))
    assert status == 200 and begun["action"] == "send", begun
    assert Operation.objects.get(pk=begun["operation_id"]).state == OperationState.IN_FLIGHT
    status, settled = worker.lease_call(
        lease,
        f"operations/{begun['operation_id']}",
        outcome="succeeded",
        external_id="ch_1",
        data={"charge": "ch_1"},
        cost_minor=500,
    )
    assert status == 200 and settled["action"] == "done", settled
    op = Operation.objects.get(pk=begun["operation_id"])
    assert op.state == OperationState.SUCCEEDED and op.external_id == "ch_1" and op.key == begun["key"]

    processes.beat()  # the worker dies before completing: no heartbeat, the reaper requeues
    (again,) = worker.acquire(wait=10)
    assert again["attempt"] == 2
    status, rerun = worker.lease_call(again, "operations", **charge(500))
    assert status == 200 and rerun["action"] == "done" and rerun["result"] == settled["result"], rerun
    assert list(Operation.objects.filter(job_id=job_id).values_list("pk", "state")) == [(op.pk, OperationState.SUCCEEDED)]
    assert worker.lease_call(again, "complete", output=rerun["result"])[0] == 200
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]


def test_a_request_budget_stops_the_second_operation_and_parks_its_job(api_server: ApiServer, worker_key: str) -> None:
    budgets.create_budget(name="one-call", scope="kind", target="http.charge", request_limit=1, actor="tests")
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.charge@1"], name="op-b")
    first_id, second_id = enqueue("http.charge", amount=100), enqueue("http.charge", amount=100)
    first, second = worker.acquire(2)
    status, begun = worker.lease_call(first, "operations", **charge(100))
    assert begun["action"] == "send", begun
    assert worker.lease_call(first, f"operations/{begun['operation_id']}", outcome="succeeded", data={})[1]["action"] == "done"
    status, refused = worker.lease_call(second, "operations", **charge(100, customer="c_2"))
    assert status == 200 and refused["action"] == "stop" and refused["reason"] == "budget", refused
    parked = job(second["job_id"])
    assert parked.state == JobState.PARKED and parked.park_reason == ParkReason.BUDGET
    assert not Operation.objects.filter(job_id=second["job_id"], state=OperationState.IN_FLIGHT).exists()
    # Parked: the lease is gone; a report on it is refused and changes nothing.
    before = snapshot(second["job_id"])
    status, body = worker.lease_call(second, "complete", output=1)
    assert status == 409, body
    assert snapshot(second["job_id"]) == before
    assert {first_id, second_id} == {first["job_id"], second["job_id"]}


def test_a_critical_charge_above_the_threshold_waits_for_review(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.charge@1"], name="op-c")
    job_id = enqueue("http.charge", amount=1200)
    (lease,) = worker.acquire()
    status, answer = worker.lease_call(lease, "operations", **charge(1200))
    assert status == 200 and answer["action"] == "stop" and answer["reason"] == "waiting_review", answer
    row = job(job_id)
    assert row.state == JobState.PARKED and row.park_reason == ParkReason.WAITING_REVIEW
    review = ReviewRequest.objects.get(job_id=job_id)
    assert review.operation_name == "charge" and review.amount_minor == 1200
    assert not Operation.objects.filter(job_id=job_id, state=OperationState.IN_FLIGHT).exists()


def test_a_drain_pause_on_the_kind_holds_acquire_until_resume(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.probe@1"], name="op-d")
    pause = pauses.pause(scope="kind", target="http.probe", reason="incident", actor="ops")
    job_id = enqueue()
    assert worker.acquire(wait=1.5) == []
    assert job(job_id).state == JobState.QUEUED
    pauses.resume(pause_id=pause.pk, actor="ops")
    (lease,) = worker.acquire(wait=5)
    assert lease["job_id"] == job_id and lease["attempt"] == 1


def test_an_unknown_outcome_is_looked_up_on_the_next_attempt_and_reconciled(api_server: ApiServer, worker_key: str) -> None:
    worker = ProtocolWorker(api_server, worker_key, kinds=["http.charge@1"], name="op-e")
    job_id = enqueue("http.charge", amount=300)
    (lease,) = worker.acquire()
    status, begun = worker.lease_call(lease, "operations", **charge(300))
    assert begun["action"] == "send", begun
    status, settled = worker.lease_call(lease, f"operations/{begun['operation_id']}", outcome="unknown", message="read timed out")
    assert status == 200, settled
    assert Operation.objects.get(pk=begun["operation_id"]).state == OperationState.UNCERTAIN
    assert settled["action"] == "raise", settled
    status, body = worker.lease_call(
        lease, "fail", classification=settled["classification"], message=settled["message"], retry_after=0
    )
    assert status == 200, body

    (again,) = worker.acquire(wait=10)
    assert again["job_id"] == job_id and again["attempt"] == 2
    status, look = worker.lease_call(again, "operations", **charge(300))
    assert status == 200 and look["action"] == "look_up" and look["key"] == begun["key"], look
    found = {"found": {"external_id": "ch_9", "data": {"charge": "ch_9"}, "cost_minor": 300}}
    status, done = worker.lease_call(again, "operations", **charge(300), lookup=found)
    assert status == 200 and done["action"] == "done", done
    op = Operation.objects.get(pk=begun["operation_id"])
    assert op.state == OperationState.RECONCILED and op.external_id == "ch_9"
    assert Operation.objects.filter(job_id=job_id).count() == 1
    assert worker.lease_call(again, "complete", output=done["result"])[0] == 200
    assert job(job_id).state == JobState.SUCCEEDED
