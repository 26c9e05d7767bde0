"""The clients of the worker protocol against a real uvicorn process: the Python SDK (sdk/python,
run in a thread of the test process or as its own process) and the SDK-less Node example.

The rows are the record (workers_job / workers_attempt / traces_span); what a body did is
recorded by the body itself, outside Koala, so "exactly once" is counted where it happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from koala_worker import Client, Declined, OperationResult, RetryableError, StepFailure, Worker

from tests.conftest import REPO, wait_for
from tests.support.api_server import ApiServer
from tests.support.fleet import assert_engine_invariants, attempts, wait_all_terminal, wait_state
from tests.support.sdk import NODE_WORKER, SDK_SRC
from traces.models import Span
from workers.models import Job, JobState, Operation, OperationState, Outcome, WorkerProcess
from workers.services import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # a live server reads the rows


def enqueue(kind: str = "http.probe", version: int = 1, **data: Any) -> int:
    return jobs.enqueue(kind=kind, version=version, input=data).job_id


@contextmanager
def serving(worker: Worker) -> Iterator[threading.Thread]:
    """``worker.serve()`` in a thread, stopped and joined however the test ends."""
    thread = threading.Thread(target=worker.serve, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=worker.shutdown_deadline + 15)
        assert not thread.is_alive(), "serve() did not return after stop()"


def sdk_worker(api_server: ApiServer, key: str, *, name: str, concurrency: int = 8) -> Worker:
    return Worker(Client(api_server.url, key, timeout=10), concurrency=concurrency, name=name, shutdown_deadline=5)


def test_eight_slots_drain_many_jobs_each_exactly_once(api_server: ApiServer, worker_key: str) -> None:
    ran: Counter[int] = Counter()
    lock = threading.Lock()
    in_flight = 0
    most = 0

    def echo(ctx: Any, data: Any) -> dict[str, Any]:
        nonlocal in_flight, most
        with lock:
            ran[ctx.job_id] += 1
            in_flight += 1
            most = max(most, in_flight)
        try:
            ctx.cancelled.wait(0.05)  # a little work, so that leases overlap
            return {"echo": data}
        finally:
            with lock:
                in_flight -= 1

    ids = [enqueue(n=n) for n in range(60)]
    worker = sdk_worker(api_server, worker_key, name="sdk-drain").register("http.probe", 1, echo)
    with serving(worker):
        wait_all_terminal(ids, timeout=60)
    assert {row.pk: row.state for row in Job.objects.filter(pk__in=ids)} == dict.fromkeys(ids, JobState.SUCCEEDED)
    assert ran == Counter(dict.fromkeys(ids, 1))
    assert 1 < most <= 8
    for job_id, n in zip(ids, range(60), strict=True):
        row = Job.objects.get(pk=job_id)
        assert row.result == {"echo": {"n": n}} and row.attempts == 1
        [attempt] = attempts(job_id)
        assert attempt.worker_id == "sdk-drain" and attempt.outcome == Outcome.SUCCEEDED
    assert_engine_invariants()


def test_complete_stores_the_state_delta_usage_and_nested_spans(api_server: ApiServer, worker_key: str) -> None:
    seen: dict[str, Any] = {}

    def agent(ctx: Any, data: Any) -> dict[str, Any]:
        seen["span_id"] = ctx.span_id
        with ctx.span("agent") as outer:
            outer.set_attribute("goal", data["goal"])
            with ctx.span("model.call") as call:
                call.set_usage(model="unpriced-model", input_tokens=100, output_tokens=20)
            with ctx.span("model.call") as call:
                call.set_usage(model="unpriced-model", input_tokens=30, output_tokens=5)
        ctx.set_state(summary="done", pages=2)
        seen["outer"] = outer.span_id
        return {"answer": 42}

    job_id = enqueue(goal="answer")
    with serving(sdk_worker(api_server, worker_key, name="sdk-spans").register("http.probe", 1, agent)):
        row = wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED)
    assert row.state == JobState.SUCCEEDED and row.result == {"answer": 42}
    assert row.run_state == {"summary": "done", "pages": 2}
    assert row.usage["input_tokens"] == 130 and row.usage["output_tokens"] == 25  # children counted once
    spans = list(Span.objects.filter(job_id=job_id))
    by_name = Counter(span.name for span in spans)
    assert by_name["agent"] == 1 and by_name["model.call"] == 2
    outer = next(span for span in spans if span.name == "agent")
    assert outer.span_id == seen["outer"] and outer.parent_id == seen["span_id"]
    assert outer.attributes == {"goal": "answer"}
    calls = [span for span in spans if span.name == "model.call"]
    assert {span.parent_id for span in calls} == {seen["outer"]}
    assert sorted(span.usage["input_tokens"] for span in calls) == [30, 100]
    assert all(span.started_at and span.ended_at and span.started_at <= span.ended_at for span in calls)


def test_a_retryable_error_is_retried_then_succeeds_and_a_step_failure_fails_for_good(
    api_server: ApiServer, worker_key: str
) -> None:
    def flaky(ctx: Any, data: Any) -> dict[str, Any]:
        if data.get("refuse"):
            raise StepFailure("account 7 is closed", code="account_closed")
        if ctx.attempt == 1:
            raise RetryableError("provider answered 503", retry_after=0)
        return {"attempt": ctx.attempt}

    retried = enqueue(n=1)
    refused = enqueue(refuse=True)
    with serving(sdk_worker(api_server, worker_key, name="sdk-flaky").register("http.probe", 1, flaky)):
        wait_all_terminal([retried, refused], timeout=30)
    row = Job.objects.get(pk=retried)
    assert row.state == JobState.SUCCEEDED and row.result == {"attempt": 2} and row.attempts == 2
    first, second = attempts(retried)
    assert (first.outcome, first.error_class, first.error_message) == (Outcome.RETRY, "RetryableError", "provider answered 503")
    assert second.outcome == Outcome.SUCCEEDED
    row = Job.objects.get(pk=refused)
    assert row.state == JobState.FAILED and row.failure_reason == "terminal" and row.attempts == 1
    assert row.error_class == "account_closed" and row.error_message == "account 7 is closed"
    assert "Traceback" not in attempts(refused)[0].error_message
    assert_engine_invariants()


def test_an_exception_is_fatal_with_its_message_only(api_server: ApiServer, worker_key: str) -> None:
    def broken(ctx: Any, data: Any) -> None:
        {}["customer"]

    job_id = enqueue()
    with serving(sdk_worker(api_server, worker_key, name="sdk-fatal").register("http.probe", 1, broken)):
        row = wait_state(job_id, JobState.FAILED)
    assert row.failure_reason == "fatal" and row.error_class == "KeyError" and row.error_message == "'customer'"
    assert row.attempts == 1


def test_a_lease_the_worker_has_no_body_for_goes_back_without_using_an_attempt(api_server: ApiServer, worker_key: str) -> None:
    ran: list[int] = []

    def fetch_step(ctx: Any, data: Any) -> None:
        ran.append(ctx.job_id)

    job_id = enqueue(n=1)
    # This worker has a body only for a step "fetch" of http.probe@1: the single-step lease has none here.
    stepped = sdk_worker(api_server, worker_key, name="sdk-stepped").register("http.probe", 1, steps={"fetch": fetch_step})
    with serving(stepped):
        wait_for(lambda: any(a.outcome == Outcome.UNSERVABLE for a in attempts(job_id)), timeout=20, what="an unservable attempt")
    assert ran == []
    row = Job.objects.get(pk=job_id)
    assert row.state == JobState.QUEUED and row.attempts == 0

    def echo(ctx: Any, data: Any) -> dict[str, Any]:
        return {"attempt": ctx.attempt}

    with serving(sdk_worker(api_server, worker_key, name="sdk-full").register("http.probe", 1, echo)):
        row = wait_state(job_id, JobState.SUCCEEDED)
    assert row.result == {"attempt": 1} and row.attempts == 1
    outcomes = [a.outcome for a in attempts(job_id)]
    assert outcomes[-1] == Outcome.SUCCEEDED and set(outcomes[:-1]) <= {Outcome.UNSERVABLE, Outcome.INTERRUPTED}
    assert Outcome.UNSERVABLE in outcomes
    assert_engine_invariants()


def test_an_operators_cancel_reaches_the_body_through_the_heartbeat(api_server: ApiServer, worker_key: str) -> None:
    started = threading.Event()
    saw_cancel = threading.Event()
    returned = threading.Event()

    def long(ctx: Any, data: Any) -> dict[str, Any]:
        started.set()
        if ctx.cancelled.wait(30):
            saw_cancel.set()
        returned.set()
        return {"late": True}  # a report after the cancel: the SDK must not send it

    job_id = enqueue()
    with serving(sdk_worker(api_server, worker_key, name="sdk-cancel").register("http.probe", 1, long)) as thread:
        assert started.wait(20)
        jobs.cancel_job(job_id=job_id, actor="operator")
        assert saw_cancel.wait(20), "the cancel did not reach the body"
        assert returned.wait(5)
        assert thread.is_alive()
    row = Job.objects.get(pk=job_id)
    assert row.state == JobState.CANCELLED and row.result != {"late": True}
    assert all(a.outcome != Outcome.SUCCEEDED for a in attempts(job_id))


SDK_PROCESS = """
import sys, time
sys.path.insert(0, {src!r})
from koala_worker import Client, Worker

def slow(ctx, data):
    print("started", ctx.job_id, flush=True)
    while not ctx.cancelled.wait(0.05):
        pass
    ctx.progress(page=7)
    ctx.checkpoint()   # the stop comes here: a safe point

Worker(Client({url!r}, {key!r}, timeout=10), concurrency=2, name="sdk-proc", shutdown_deadline=10).register(
    "http.probe", 1, slow
).serve()
print("stopped", flush=True)
"""


def test_sigterm_gives_a_running_lease_back_at_a_safe_point(api_server: ApiServer, worker_key: str, tmp_path: Path) -> None:
    job_id = enqueue()
    log = tmp_path / "sdk-proc.log"
    script = SDK_PROCESS.format(src=str(SDK_SRC), url=api_server.url, key=worker_key)
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: f"started {job_id}" in log.read_text(), timeout=20, what="the body to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped" in log.read_text()
    row = Job.objects.get(pk=job_id)
    assert row.state == JobState.QUEUED and row.attempts == 0, (row.state, row.attempts)
    assert row.progress == {"page": 7}  # the checkpoint left before the stop was stored
    # The released job may be leased once more by the long-poll still open at the stop (it is
    # not cut before the deadline, so as not to lose leases just granted), and given back unstarted.
    tries = attempts(job_id)
    assert [a.outcome for a in tries] in ([Outcome.INTERRUPTED], [Outcome.INTERRUPTED] * 2), [
        (a.outcome, a.error_message) for a in tries
    ]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_node_example_drains_jobs_and_exits_on_sigterm(api_server: ApiServer, worker_key: str, tmp_path: Path) -> None:
    ids = [enqueue(n=n) for n in range(20)]
    log = tmp_path / "node.log"
    env = {
        **os.environ,
        "KOALA_URL": api_server.url,
        "KOALA_API_KEY": worker_key,
        "KOALA_KINDS": "http.probe@1",
        "KOALA_WORKER_NAME": "node-1",
        "KOALA_CONCURRENCY": "4",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(["node", str(NODE_WORKER)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_all_terminal(ids, timeout=60)
        for job_id, n in zip(ids, range(20), strict=True):
            row = Job.objects.get(pk=job_id)
            assert row.state == JobState.SUCCEEDED, (row.state, log.read_text())
            assert row.result == {"echo": {"n": n}} and row.attempts == 1
            assert [a.worker_id for a in attempts(job_id)] == ["node-1"]
        slow = enqueue(delay_ms=60_000)
        wait_state(slow, JobState.RUNNING, timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    row = Job.objects.get(pk=slow)
    assert row.state == JobState.QUEUED and row.attempts == 0, log.read_text()  # given back at a safe point
    assert_engine_invariants()


def test_an_operation_is_performed_once_across_retries_and_its_result_comes_back(api_server: ApiServer, worker_key: str) -> None:
    calls: list[str] = []

    def charge(ctx: Any, data: Any) -> dict[str, Any]:
        def perform(key: str) -> OperationResult:
            calls.append(key)
            return OperationResult(external_id=f"ch_{len(calls)}", data={"charge": f"ch_{len(calls)}"}, cost_minor=data["amount"])

        result = ctx.operation(
            "charge",
            kind="charge",
            params={"amount": data["amount"], "customer": "c_1"},
            amount_minor=data["amount"],
            currency="EUR",
            target="c_1",
            estimate_minor=data["amount"],
            perform=perform,
        )
        if ctx.attempt == 1:
            raise RetryableError("the receipt mail bounced", retry_after=0)  # after the charge: the retry must not charge again
        return {"charged": result}

    job_id = enqueue("http.charge", amount=500)
    with serving(sdk_worker(api_server, worker_key, name="sdk-charge").register("http.charge", 1, charge)):
        row = wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, JobState.PARKED)
    assert row.state == JobState.SUCCEEDED and row.attempts == 2, (row.state, row.error_message)
    assert row.result == {"charged": {"charge": "ch_1"}}
    assert len(calls) == 1 and calls[0].startswith(f"koala-job-{job_id}")
    [op] = Operation.objects.filter(job_id=job_id)
    assert (op.state, op.external_id, op.key, op.amount_minor) == (OperationState.SUCCEEDED, "ch_1", calls[0], 500)


def test_a_declined_operation_fails_the_job_and_one_over_the_review_line_parks_it_unsent(
    api_server: ApiServer, worker_key: str
) -> None:
    calls: list[int] = []
    ended: list[int] = []

    def charge(ctx: Any, data: Any) -> dict[str, Any]:
        def perform(key: str) -> OperationResult:
            calls.append(ctx.job_id)
            raise Declined("card declined")

        try:
            ctx.operation(
                "charge", kind="charge", params={"amount": data["amount"]}, amount_minor=data["amount"], perform=perform
            )
        finally:
            ended.append(ctx.job_id)
        return {"never": True}

    declined = enqueue("http.charge", amount=200)
    reviewed = enqueue("http.charge", amount=5000)  # above the kind's critical line of 1000: a person approves first
    with serving(sdk_worker(api_server, worker_key, name="sdk-decline").register("http.charge", 1, charge)):
        row = wait_state(declined, JobState.FAILED)
        parked = wait_state(reviewed, JobState.PARKED)
        wait_for(lambda: reviewed in ended, timeout=10, what="the parked body to end")
    # Named as an RQ worker's record names the same failure (workers.outcomes.error_class_of).
    assert (
        row.failure_reason == "terminal"
        and row.error_class == "TerminalFailure:declined"
        and "card declined" in row.error_message
    )
    assert calls == [declined]  # the one over the line was never sent
    assert parked.park_reason == "waiting_review" and parked.attempts == 0
    assert Operation.objects.get(job_id=declined).state == OperationState.FAILED
    assert_engine_invariants()


def test_a_server_restart_and_a_forgotten_registration_lose_nothing(api_server: ApiServer, worker_key: str) -> None:
    ran: Counter[int] = Counter()
    lock = threading.Lock()

    def echo(ctx: Any, data: Any) -> dict[str, Any]:
        with lock:
            ran[ctx.job_id] += 1
        return {"echo": data}

    first = [enqueue(n=n) for n in range(10)]
    with serving(sdk_worker(api_server, worker_key, name="sdk-restart").register("http.probe", 1, echo)):
        wait_all_terminal(first, timeout=30)
        # The server restarts having lost the worker's registration (a database reset): the worker
        # sees resets and refusals, backs off, is answered 404 unknown_worker, and registers again.
        WorkerProcess.objects.filter(name="sdk-restart").delete()
        api_server.restart()
        second = [enqueue(n=n) for n in range(10, 20)]
        wait_all_terminal(second, timeout=60)
    assert WorkerProcess.objects.filter(name="sdk-restart").exists()
    ids = first + second
    assert {row.pk: row.state for row in Job.objects.filter(pk__in=ids)} == dict.fromkeys(ids, JobState.SUCCEEDED)
    assert ran == Counter(dict.fromkeys(ids, 1))
    assert_engine_invariants()


def test_a_body_still_running_at_the_shutdown_deadline_is_given_back_by_its_delivery(
    api_server: ApiServer, worker_key: str
) -> None:
    started: list[int] = []
    release = threading.Event()

    def stubborn(ctx: Any, data: Any) -> dict[str, Any]:
        started.append(ctx.job_id)
        release.wait(60)  # ignores ctx.cancelled: cut off mid-way at the deadline
        return {"late": True}

    again = enqueue("http.probe")
    once = enqueue("http.once")
    worker = sdk_worker(api_server, worker_key, name="sdk-deadline", concurrency=2)
    worker.shutdown_deadline = 1.0
    worker.register("http.probe", 1, stubborn).register("http.once", 1, stubborn)
    try:
        with serving(worker):
            wait_for(lambda: sorted(started) == sorted([again, once]), timeout=20, what="both bodies to start")
        # serve() has returned: both leases were given back at the deadline, body_started and no safe point.
        row = Job.objects.get(pk=again)
        assert row.state == JobState.QUEUED, row.state  # at_least_once: requeued
        row = Job.objects.get(pk=once)
        assert row.state == JobState.FAILED and row.failure_reason == "orphaned", (row.state, row.failure_reason)
    finally:
        release.set()  # let the abandoned body threads end
