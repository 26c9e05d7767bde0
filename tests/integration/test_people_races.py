"""People-side services under races: every decision is made by the database, never by a read
that a concurrent writer can invalidate, and every refusal is a clear error that changed nothing.

Concurrent cases release threads past a barrier; each thread has its own connection (Django
opens one per thread) and commits for real (transaction=True).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from koala.models import AuditEvent
from reviews.models import ReviewRequest
from reviews.services import approve_review, expire_reviews, reject_review
from tests.inprocess import run_until
from workers.errors import JobStateError, SafetyError
from workers.models import Budget, BudgetUsage, Job, ModelPrice, Operation, Pause
from workers.services import budgets, leases, pauses
from workers.services.jobs import cancel_job, enqueue, requeue_job
from workers.services.operations import resolve_operation

# transaction=True: each thread has its own connection and must see the others' commits and locks
# (and the parked states are reached through the in-process runtime: tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)

CLEAR = (SafetyError, JobStateError)  # the refusals a person may see


def together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls at once (threads past a barrier); each result is a value or the exception."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = calls[index]()
        except Exception as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def unclear(results: list[Any]) -> list[str]:
    return [f"{type(r).__name__}: {r}" for r in results if isinstance(r, Exception) and not isinstance(r, CLEAR)]


def parked_with_uncertain_charge(tmp_path: Path, n: int = 0) -> tuple[int, Operation]:
    """A job parked needs_attention with an uncertain charge (the provider has no lookup)."""
    world = str(tmp_path / f"world-{n}.log")  # its one-off fault fires once per world file
    data = {"world": world, "mode": "unknown_once", "no_lookup": True, "amount": 300, "n": n}
    job_id = enqueue(kind="tests.charge", input=data).job_id
    job = run_until(job_id, "parked")
    assert job.park_reason == "needs_attention"
    op = Operation.objects.get(job_id=job_id)
    assert op.state == "uncertain"
    return job_id, op


def parked_for_review(tmp_path: Path, n: int = 0) -> tuple[int, ReviewRequest]:
    world = str(tmp_path / "world.log")
    job_id = enqueue(kind="tests.charge", input={"world": world, "amount": 6000, "n": n}, created_by="alice").job_id
    job = run_until(job_id, "parked")
    assert job.park_reason == "waiting_review"
    return job_id, ReviewRequest.objects.get(job_id=job_id, state="pending")


# -- resolve_operation ---------------------------------------------------------------------------


def test_resolving_an_operation_whose_job_is_not_parked_for_attention_is_refused(tmp_path: Path, redis_clean: None) -> None:
    budget = budgets.create_budget(name="charges", scope="kind", target="tests.charge", spend_limit_minor=10_000, actor="ops")
    job_id, op = parked_with_uncertain_charge(tmp_path)
    assert op.reservations  # the uncertain charge still holds its reservation
    usage_before = list(BudgetUsage.objects.filter(budget=budget).values())

    requeue_job(job_id=job_id, actor="ops")  # queued: the re-run will reconcile it itself
    with pytest.raises(SafetyError, match="queued"):
        resolve_operation(operation_id=op.pk, happened=False, note="support says no", actor="ops")
    # Running: the attempt settles this operation's reservations itself; a person must not race it.
    assert leases.claim_job(job_id=job_id, worker="w", lease_seconds=30) is not None
    with pytest.raises(SafetyError, match="running"):
        resolve_operation(operation_id=op.pk, happened=True, external_id="ch_1", note="seen it", actor="ops")

    after = Operation.objects.get(pk=op.pk)
    assert (after.state, after.resolution, after.reservations, after.settled_at) == (
        op.state,
        op.resolution,
        op.reservations,
        None,
    )
    assert list(BudgetUsage.objects.filter(budget=budget).values()) == usage_before
    assert not AuditEvent.objects.filter(action="operation.resolve").exists()


def test_an_operation_of_a_finished_job_can_still_be_settled(tmp_path: Path, redis_clean: None) -> None:
    """A cancelled job's uncertain charge would otherwise hold its reservation for ever."""
    budget = budgets.create_budget(name="charges", scope="kind", target="tests.charge", spend_limit_minor=10_000, actor="ops")
    job_id, op = parked_with_uncertain_charge(tmp_path)
    cancel_job(job_id=job_id, actor="ops", reason="customer left")
    resolve_operation(operation_id=op.pk, happened=True, external_id="ch_9", note="in the provider dashboard", actor="ops")
    after = Operation.objects.get(pk=op.pk)
    assert (after.state, after.reservations) == ("reconciled", [])
    usage = BudgetUsage.objects.get(budget=budget)
    assert (usage.reserved_minor, usage.spent_minor) == (0, 300)
    assert Job.objects.get(pk=job_id).state == "cancelled"


def test_resolve_racing_an_operator_requeue_acts_only_on_a_parked_job(tmp_path: Path, redis_clean: None) -> None:
    late = 0
    for n in range(8):
        job_id, op = parked_with_uncertain_charge(tmp_path, n)
        resolve, requeue = together(
            lambda op=op: resolve_operation(operation_id=op.pk, happened=False, note="support says no", actor="ops"),
            lambda job_id=job_id: requeue_job(job_id=job_id, actor="ops2"),
        )
        assert unclear([resolve, requeue]) == []
        assert not isinstance(requeue, Exception)
        if isinstance(resolve, Exception):
            # The requeue won: the job is queued and its re-run reconciles the operation; nothing changed.
            assert Operation.objects.get(pk=op.pk).state == "uncertain"
            continue
        # The resolution won, so it found the job parked and was the one that queued it again.
        audit = AuditEvent.objects.get(action="operation.resolve", target_id=str(op.pk))
        late += not audit.details["requeued"]
    assert late == 0, f"{late} resolutions were recorded after an operator had already requeued the job"


# -- budgets -------------------------------------------------------------------------------------


def test_concurrent_budgets_with_one_name_give_one_budget_and_clear_refusals() -> None:
    for round_number in range(5):
        name = f"daily-{round_number}"
        results = together(
            *[
                lambda: budgets.create_budget(name=name, scope="queue", target="default", request_limit=10, actor="ops")
                for _ in range(8)
            ]
        )
        assert unclear(results) == []
        assert sum(isinstance(r, Budget) for r in results) == 1
        assert all("already exists" in str(r) for r in results if isinstance(r, Exception))
        assert Budget.objects.filter(name=name).count() == 1


# -- reviews against cancellation and expiry ------------------------------------------------------


DECIDERS: dict[str, Callable[[ReviewRequest], Any]] = {
    "approve": lambda review: approve_review(review_id=review.pk, actor="bob", comment="ok"),
    "reject": lambda review: reject_review(review_id=review.pk, actor="bob", comment="no"),
    "expire": lambda review: expire_reviews(),
}


@pytest.mark.parametrize("decision", sorted(DECIDERS))
def test_a_review_decision_racing_a_cancel_never_deadlocks(
    tmp_path: Path, redis_clean: None, reviewers: object, decision: str
) -> None:
    failures: list[str] = []
    for n in range(12):
        job_id, review = parked_for_review(tmp_path, n)
        if decision == "expire":
            ReviewRequest.objects.filter(pk=review.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
        decided, cancelled = together(
            lambda review=review: DECIDERS[decision](review),
            lambda job_id=job_id: cancel_job(job_id=job_id, actor="ops", reason="customer left"),
        )
        failures += unclear([decided, cancelled])
        job = Job.objects.get(pk=job_id)
        review.refresh_from_db()
        # Whoever won, the end is consistent: a terminal job, and no review left open on it.
        assert job.state in ("cancelled", "failed"), job.state
        assert review.state not in ("pending", "approved"), review.state
    assert failures == []


# -- pauses and prices: guards that already were the database's ----------------------------------


def test_concurrent_pauses_of_one_scope_give_one_pause_and_clear_refusals() -> None:
    results = together(*[lambda: pauses.pause(scope="queue", target="default", reason="incident", actor="ops") for _ in range(8)])
    assert unclear(results) == []
    assert sum(isinstance(r, Pause) for r in results) == 1
    assert all("already paused" in str(r) for r in results if isinstance(r, Exception))
    assert Pause.objects.filter(scope="queue", target="default", lifted_at__isnull=True).count() == 1
    live = Pause.objects.get(lifted_at__isnull=True)
    resumed = together(*[lambda: pauses.resume(pause_id=live.pk, actor="ops") for _ in range(4)])
    assert unclear(resumed) == []
    assert sum(isinstance(r, Pause) for r in resumed) == 1
    assert AuditEvent.objects.filter(action="resume").count() == 1


def test_concurrent_price_settings_of_a_new_model_never_leak_integrity_errors() -> None:
    results = together(
        *[
            lambda n=n: budgets.set_model_price(model="m-new", input_minor_per_mtok=n, output_minor_per_mtok=n, actor="ops")
            for n in range(8)
        ]
    )
    assert unclear(results) == []
    assert ModelPrice.objects.filter(model="m-new").count() == 1


def test_concurrent_limit_changes_are_serialized_and_each_audited() -> None:
    budget = budgets.create_budget(name="b", scope="global", request_limit=1, actor="ops")
    results = together(
        *[lambda n=n: budgets.update_budget(budget_id=budget.pk, actor="ops", request_limit=n) for n in range(2, 8)]
    )
    assert unclear(results) == []
    stored = Budget.objects.get(pk=budget.pk).request_limit
    audits = list(AuditEvent.objects.filter(action="budget.update").order_by("id").values_list("details", flat=True))
    # Each change saw the one before it (the row lock): the befores chain, and the last after is stored.
    assert [a["before"]["request_limit"] for a in audits[1:]] == [a["after"]["request_limit"] for a in audits[:-1]]
    assert audits[-1]["after"]["request_limit"] == stored
