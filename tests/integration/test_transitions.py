"""One transition writer: an attempt ends the same way whichever kind of worker ran it.

The RQ runtime runs bodies here, in the test process (tests/inprocess.py); the HTTP worker is
played by calling the protocol's services exactly as the API's views do (register, claim for a
waiting worker, the ledger's begin/settle, complete, fail). Both end attempts through
``workers.transitions``; these tests hold the two side by side and check the records they leave:
the same names, the same usage and cost on the job, the same run time on budgets, and the
in-transaction hook ("a job reached this state") for every ending, the reaper's and people's too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from api import protocol
from api.protocol import Registration
from tests.inprocess import run_until
from workers import hooks
from workers.hooks import Transition
from workers.models import Attempt, Budget, BudgetUsage, Job, JobState, Outcome
from workers.services import budgets, maintenance
from workers.services.jobs import cancel_job, enqueue
from workers.services.leases import HeldLease, Lease

# transaction=True: claims compare scheduled_at with PostgreSQL's now(), which stands still
# inside one transaction, so a job enqueued in the test's transaction never falls due there.
pytestmark = pytest.mark.django_db(transaction=True)


class InProcessHttpWorker:
    """The protocol's services called as api.views.worker calls them, for one registered worker."""

    def __init__(self, kinds: Sequence[tuple[str, int]], *, name: str = "http.test.1", key: str = "testkey") -> None:
        self.key = key
        self.registration: Registration = protocol.register(
            key_prefix=key,
            name=name,
            hostname="test",
            pid=1,
            served_kinds=[(kind, version, []) for kind, version in kinds],
            queues=None,
            concurrency=4,
        )

    def acquire(self) -> HeldLease:
        got = protocol.claim_for(self.registration, count=1, state=protocol.claim_pass())
        assert len(got) == 1, "no lease for the HTTP worker"
        return self.hold(got[0])

    def hold(self, lease: Lease) -> HeldLease:
        """The lease as a call about it finds it (the view's protocol.held_lease, token checked)."""
        worker = self.registration.worker_id
        token = protocol.lease_token(attempt_id=lease.attempt_id, lease_token=lease.lease_token, worker_id=worker)
        return protocol.held_lease(lease_id=lease.attempt_id, worker_id=worker, token=token, key_prefix=self.key)

    def refresh(self, held: HeldLease) -> HeldLease:
        return self.hold(held.lease)

    def begin(self, held: HeldLease, name: str, **options: Any) -> dict[str, Any]:
        return protocol.begin_operation(held=held, name=name, options=options, can_look_up=False, lookup=None)

    def settle(self, held: HeldLease, operation_id: int, outcome: str, **found: Any) -> dict[str, Any]:
        message = found.pop("message", "")
        return protocol.settle_operation(
            held=held, operation_id=operation_id, outcome=outcome, found=found, message=message, retry_after=None
        )

    def fail_as_told(self, held: HeldLease, answer: dict[str, Any]) -> str:
        """What an SDK does with an operation's ``raise`` answer: fail the lease as it says."""
        assert answer["action"] == "raise", answer
        return protocol.fail(
            held=held,
            classification=answer["classification"],
            error_class=answer["error_class"],
            message=answer["message"],
            retry_after=answer.get("retry_after"),
            body_started=True,
            safe_point=False,
        )


@pytest.fixture
def transitions_seen() -> Iterator[list[tuple[Transition, str, bool]]]:
    """Every transition the engine reports to the hook, with the job's state as the hook's own
    transaction reads it and whether the hook ran inside a transaction."""
    seen: list[tuple[Transition, str, bool]] = []

    def record(changes: Sequence[Transition]) -> None:
        for change in changes:
            state = Job.objects.values_list("state", flat=True).get(pk=change.job_id)
            seen.append((change, state, connection.in_atomic_block))

    hooks.register_on_transition("tests.seen", record)
    try:
        yield seen
    finally:
        hooks.unregister_on_transition("tests.seen")


def charge_input(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"world": str(tmp_path / "world.log"), "amount": 300, **extra}


def test_a_declined_charge_is_recorded_alike_by_an_rq_and_an_http_worker(tmp_path: Path, redis_clean: None) -> None:
    rq_job = enqueue(kind="tests.charge", input=charge_input(tmp_path, mode="declined")).job_id
    rq = run_until(rq_job)

    http_job = enqueue(kind="http.charge", input={"amount": 300}).job_id
    worker = InProcessHttpWorker([("http.charge", 1)])
    held = worker.acquire()
    begun = worker.begin(held, "charge", kind="charge", params={"amount_minor": 300}, estimate_minor=300, amount_minor=300)
    assert begun["action"] == "send", begun
    told = worker.settle(held, begun["operation_id"], "declined", message="card declined")
    assert worker.fail_as_told(held, told) == Outcome.FAILED
    http = Job.objects.get(pk=http_job)

    assert (rq.state, rq.failure_reason) == (http.state, http.failure_reason) == (JobState.FAILED, "terminal")
    assert http.error_class == rq.error_class == "TerminalFailure:declined"
    assert http.error_message == rq.error_message.replace("tests.charge", "http.charge")


def test_operation_cost_reaches_the_job_for_both_kinds_of_worker(tmp_path: Path, redis_clean: None) -> None:
    rq = run_until(enqueue(kind="tests.charge", input=charge_input(tmp_path)).job_id)
    assert rq.state == JobState.SUCCEEDED and rq.usage.get("cost_minor") == 300

    http_job = enqueue(kind="http.charge", input={"amount": 300}).job_id
    worker = InProcessHttpWorker([("http.charge", 1)])
    held = worker.acquire()
    begun = worker.begin(held, "charge", kind="charge", params={"amount_minor": 300}, estimate_minor=300, amount_minor=300)
    done = worker.settle(held, begun["operation_id"], "succeeded", external_id="ch_1", data={"charged": 300}, cost_minor=300)
    assert done["action"] == "done"
    outcome = protocol.complete(held=held, output={"ok": True}, state_delta={}, usage=None, spans=[], duration_seconds=0.1)
    assert outcome == Outcome.SUCCEEDED
    http = Job.objects.get(pk=http_job)
    assert http.usage.get("cost_minor") == 300
    attempt = Attempt.objects.get(job_id=http_job)
    assert attempt.usage.get("cost_minor") == 300


def test_the_ledgers_cost_is_kept_on_the_job_even_when_the_attempt_never_reports(redis_clean: None) -> None:
    """Money spent by an attempt that then vanished (kill -9, a lost HTTP worker) was still spent."""
    job_id = enqueue(kind="http.charge", input={"amount": 120}).job_id
    worker = InProcessHttpWorker([("http.charge", 1)])
    held = worker.acquire()
    begun = worker.begin(held, "charge", kind="charge", params={"amount_minor": 120}, estimate_minor=120, amount_minor=120)
    worker.settle(held, begun["operation_id"], "succeeded", external_id="ch_2", data={}, cost_minor=120)
    assert Job.objects.get(pk=job_id).usage.get("cost_minor") == 120


def test_an_http_attempt_counts_its_run_time_on_budgets(redis_clean: None) -> None:
    budget = budgets.create_budget(name="run time", scope="queue", target="default", actor="test", run_seconds_limit=3600)
    job_id = enqueue(kind="http.probe", input={}).job_id
    worker = InProcessHttpWorker([("http.probe", 2)])
    held = worker.acquire()
    time.sleep(0.3)  # the attempt must take wall time for its run time to count
    protocol.complete(held=held, output=None, state_delta={}, usage=None, spans=[], duration_seconds=0.3)
    assert Job.objects.get(pk=job_id).state == JobState.SUCCEEDED
    usage = BudgetUsage.objects.get(budget=budget)
    assert 0.3 <= usage.run_seconds < 30
    assert usage.attempts == 1


def test_an_rq_attempt_counts_its_run_time_once(redis_clean: None) -> None:
    budget = budgets.create_budget(name="run time", scope="queue", target="default", actor="test", run_seconds_limit=3600)
    job = run_until(enqueue(kind="sleep", input={"seconds": 0.3}).job_id)
    assert job.state == JobState.SUCCEEDED
    usage = BudgetUsage.objects.get(budget=budget)
    assert 0.3 <= usage.run_seconds < 10
    assert Budget.objects.count() == 1


def test_every_ending_reaches_the_hook_inside_its_transaction(
    tmp_path: Path, redis_clean: None, transitions_seen: list[tuple[Transition, str, bool]]
) -> None:
    done = run_until(enqueue(kind="noop", input={}).job_id)
    failed = run_until(enqueue(kind="terminal", input={}).job_id)

    http_job = enqueue(kind="http.probe", input={}).job_id
    worker = InProcessHttpWorker([("http.probe", 2)])
    held = worker.acquire()
    protocol.complete(held=held, output=1, state_delta={}, usage=None, spans=[], duration_seconds=0.0)

    given_back = enqueue(kind="http.probe", input={"n": 2}).job_id
    protocol.give_back(leases_=[worker.acquire().lease])

    cancelled = enqueue(kind="http.probe", input={"n": 3}).job_id
    cancel_job(job_id=cancelled, actor="test")

    reaped = enqueue(kind="http.once", input={}).job_id
    worker_once = InProcessHttpWorker([("http.once", 1)], name="http.test.2")
    claimed = worker_once.acquire()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_expires_at = now() - interval '1 minute' WHERE id = %s", [reaped])
    maintenance.reap(grace_seconds=0)

    by_job: dict[int, list[tuple[str, str | None, str, bool]]] = {}
    for change, state_seen, in_transaction in transitions_seen:
        by_job.setdefault(change.job_id, []).append((change.state, change.outcome, state_seen, in_transaction))
    assert by_job[done.pk][-1] == (JobState.SUCCEEDED, Outcome.SUCCEEDED, JobState.SUCCEEDED, True)
    assert by_job[failed.pk][-1] == (JobState.FAILED, Outcome.FAILED, JobState.FAILED, True)
    assert by_job[http_job][-1] == (JobState.SUCCEEDED, Outcome.SUCCEEDED, JobState.SUCCEEDED, True)
    assert by_job[given_back][-1] == (JobState.QUEUED, Outcome.INTERRUPTED, JobState.QUEUED, True)
    assert by_job[cancelled][-1] == (JobState.CANCELLED, None, JobState.CANCELLED, True)
    assert by_job[reaped][-1] == (JobState.FAILED, Outcome.ORPHANED, JobState.FAILED, True)
    assert claimed.lease.job_id == reaped
    kinds_seen = {change.job_id: change.kind for change, _, _ in transitions_seen}
    assert kinds_seen[http_job] == "http.probe" and kinds_seen[done.pk] == "noop"


def test_a_hook_that_fails_undoes_the_transition_it_was_told_of(redis_clean: None) -> None:
    """In the transaction means all or nothing: what hangs on an ending (a workflow's next steps)
    can never be lost while the ending itself is recorded."""

    def refuse(changes: Sequence[Transition]) -> None:
        raise RuntimeError("the app above refused")

    job_id = enqueue(kind="http.probe", input={}).job_id
    worker = InProcessHttpWorker([("http.probe", 2)])
    held = worker.acquire()
    hooks.register_on_transition("tests.refuse", refuse)
    try:
        with pytest.raises(RuntimeError, match="the app above refused"):
            protocol.complete(held=held, output=1, state_delta={}, usage=None, spans=[], duration_seconds=0.0)
    finally:
        hooks.unregister_on_transition("tests.refuse")
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.RUNNING
    assert Attempt.objects.get(job_id=job_id).outcome is None
    held = worker.refresh(held)
    assert protocol.complete(held=held, output=1, state_delta={}, usage=None, spans=[], duration_seconds=0.0) == "succeeded"
