"""The safety layer in this process on real PostgreSQL + Redis: ledger, budgets, pauses, reviews.

Job bodies run through the real runtime (``drain``); the "outside world" is the file-backed
idempotent provider in tests.kinds, so effect counts are the provider's, not Koala's.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from koala.models import AuditEvent
from reviews.models import ReviewRequest
from reviews.services import approve_review, expire_reviews, reject_review
from tests.inprocess import drain, run_until
from tests.kinds import world_effects
from workers import kinds
from workers.context import JobContext
from workers.errors import OperationMismatch, SafetyError, StaleAttempt
from workers.ledger import OperationResult
from workers.models import Attempt, Budget, BudgetUsage, Job, Operation, Pause
from workers.runtime import get_runtime
from workers.services import budgets, leases, pauses
from workers.services.budgets import BudgetExhausted
from workers.services.jobs import enqueue, requeue_job
from workers.services.operations import resolve_operation

# transaction=True: bodies run through the real runtime, whose claims need committed rows (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def charge(tmp_path: Path, created_by: str = "", **data: object) -> int:
    world = str(tmp_path / "world.log")
    return enqueue(kind="tests.charge", input={"world": world, **data}, created_by=created_by).job_id


def effects(tmp_path: Path) -> list[list[str]]:
    return world_effects(str(tmp_path / "world.log"))


# -- the ledger ----------------------------------------------------------------------------------


def test_rerun_after_success_returns_stored_result_without_calling_out(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, mode="retry_after_op_once", amount=700)
    job = run_until(job_id, "succeeded")
    assert job.result == {"charged": 700}
    assert len(effects(tmp_path)) == 1
    op = Operation.objects.get(job_id=job_id)
    assert (op.state, op.attempts, op.cost_minor) == ("succeeded", 1, 700)
    assert job.attempts == 2  # the second attempt reached the same operation and skipped it


def test_outcome_unknown_is_reconciled_to_one_effect(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, mode="unknown_once", amount=300)
    job = run_until(job_id, "succeeded")
    op = Operation.objects.get(job_id=job_id)
    assert (op.state, op.resolution, op.attempts) == ("reconciled", "found", 1)
    assert len(effects(tmp_path)) == 1
    assert job.result == {"charged": 300}


def test_unreconcilable_outcome_parks_needs_attention_until_a_person_resolves_it(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, mode="unknown_once", no_lookup=True, amount=300)
    job = run_until(job_id, "parked")
    assert (job.park_reason, job.attempts) == ("needs_attention", 1)
    op = Operation.objects.get(job_id=job_id)
    assert op.state == "uncertain"
    drain()  # parked: nobody claims it, nothing is re-sent
    assert len(effects(tmp_path)) == 1 and Job.objects.get(pk=job_id).state == "parked"

    with pytest.raises(SafetyError, match="external id"):
        resolve_operation(operation_id=op.pk, happened=True, note="seen in dashboard", actor="ops")
    resolve_operation(operation_id=op.pk, happened=True, external_id="ch_manual_1", note="seen in dashboard", actor="ops")
    job = run_until(job_id, "succeeded")
    assert job.result == {"external_id": "ch_manual_1", "resolved_manually": True}
    assert len(effects(tmp_path)) == 1
    assert AuditEvent.objects.filter(action="operation.resolve", target_id=str(op.pk)).count() == 1


def test_a_reconcile_answering_the_wrong_type_parks_for_a_person_at_once(tmp_path: Path, redis_clean: None) -> None:
    # Attempt 1: the charge's outcome is unknown; attempt 2 reconciles, and the kind's lookup
    # returns a raw dict. Nothing may be re-sent (the charge may have happened), and looking
    # again cannot help: the kind's code is wrong. A person settles it; no loop until a bound.
    job_id = charge(tmp_path, mode="unknown_once", raw_lookup=True, amount=300)
    job = run_until(job_id, "parked", timeout=10)
    assert (job.park_reason, job.attempts) == ("needs_attention", 1)
    assert "reconcile() for 'charge' returned dict" in job.park_detail and "bug in the kind" in job.park_detail
    op = Operation.objects.get(job_id=job_id)
    assert op.state == "uncertain" and "returned dict" in op.error_message
    assert Attempt.objects.filter(job_id=job_id).count() == 2  # the first send, and one look
    assert len(effects(tmp_path)) == 1
    resolve_operation(operation_id=op.pk, happened=True, external_id="ch_seen", note="in the provider's dashboard", actor="ops")
    assert run_until(job_id, "succeeded").result == {"external_id": "ch_seen", "resolved_manually": True}
    assert len(effects(tmp_path)) == 1


def test_resolved_as_not_happened_is_resent_under_the_same_key(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, mode="unknown_once", no_lookup=True, amount=300)
    run_until(job_id, "parked")
    op = Operation.objects.get(job_id=job_id)
    # The provider did commit (unknown_once), so a re-send under the same key is absorbed by it.
    resolve_operation(operation_id=op.pk, happened=False, note="provider support says no record", actor="ops")
    run_until(job_id, "succeeded")
    op.refresh_from_db()
    assert (op.state, op.attempts) == ("succeeded", 2)
    assert len(effects(tmp_path)) == 1


def test_not_performed_is_resent_and_declined_fails_terminally(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, mode="not_performed_once", amount=10)
    run_until(job_id, "succeeded")
    op = Operation.objects.get(job_id=job_id)
    assert (op.state, op.attempts) == ("succeeded", 2)
    assert len(effects(tmp_path)) == 1

    declined = charge(tmp_path / "..", mode="declined", amount=10)
    job = run_until(declined, "failed")
    assert (job.failure_reason, job.error_class) == ("terminal", "TerminalFailure:declined")
    assert Operation.objects.get(job_id=declined).state == "failed"


def test_reused_operation_key_with_other_params_is_a_clear_error_and_changes_nothing(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, amount=100)
    job = Job.objects.get(pk=job_id)
    Operation.objects.create(
        job=job,
        lease_token=0,
        name="charge",
        key=f"koala-job-{job_id}:charge",
        kind="charge",
        fingerprint="0" * 64,
        state="succeeded",
        result={"charged": 999},
    )
    job = run_until(job_id, "failed")
    assert job.error_class == f"{OperationMismatch.__name__}:operation_mismatch"
    assert "other parameters" in job.error_message
    op = Operation.objects.get(job_id=job_id)
    assert (op.fingerprint, op.result, op.attempts) == ("0" * 64, {"charged": 999}, 0)
    assert effects(tmp_path) == []


def test_a_stale_attempt_cannot_record_an_operation(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, amount=100)
    runtime = get_runtime()
    old = leases.claim_job(job_id=job_id, worker="w-old", lease_seconds=30)
    assert old is not None
    requeue_job(job_id=job_id, actor="ops")  # fences the old holder
    new = leases.claim_job(job_id=job_id, worker="w-new", lease_seconds=30)
    assert new is not None and new.lease_token > old.lease_token
    kind = kinds.get("tests.charge", 1)
    assert kind is not None
    calls: list[str] = []

    def perform(key: str) -> OperationResult:
        calls.append(key)
        return OperationResult()

    ctx = JobContext(old, kind, runtime)
    with pytest.raises(StaleAttempt):
        ctx.operation("charge", kind="charge", params={"a": 1}, perform=perform)
    assert calls == [] and not Operation.objects.filter(job_id=job_id).exists()


@pytest.mark.parametrize("currency", ["eur", "EURO", "E1R", "€"])
def test_an_operations_currency_must_be_a_code(currency: str, tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, amount=100)
    lease = leases.claim_job(job_id=job_id, worker="w", lease_seconds=30)
    kind = kinds.get("tests.charge", 1)
    assert lease is not None and kind is not None
    ctx = JobContext(lease, kind, get_runtime())
    with pytest.raises(ValueError, match="currency must be a 3-letter code in capitals"):
        ctx.operation("charge", kind="charge", params={"a": 1}, perform=lambda key: OperationResult(), currency=currency)
    assert not Operation.objects.exists()


# -- budgets ---------------------------------------------------------------------------------------


def test_concurrent_reservations_never_exceed_the_cap() -> None:
    budget = budgets.create_budget(name="spend-7", scope="kind", target="tests.spend", spend_limit_minor=700, actor="ops")
    granted: list[int] = []
    refused: list[int] = []
    barrier = threading.Barrier(20)

    def reserve(n: int) -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                budgets.reserve(kind="tests.spend", queue="default", tenant="", estimate_minor=100)
            granted.append(n)
        except BudgetExhausted:
            refused.append(n)
        finally:
            connection.close()

    threads = [threading.Thread(target=reserve, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (len(granted), len(refused)) == (7, 13)
    usage = BudgetUsage.objects.get(budget=budget)
    assert (usage.reserved_minor, usage.requests) == (700, 7)


def test_budgets_are_in_the_cost_currency(settings: object, capsys: pytest.CaptureFixture[str]) -> None:
    """Spend is priced and reserved in KOALA_COST_CURRENCY and Koala converts nothing, so a budget
    is in that currency: another one could not be honoured, and asking for it is refused."""
    settings.KOALA_COST_CURRENCY = "USD"  # type: ignore[attr-defined]
    budget = budgets.create_budget(name="usd", scope="kind", target="tests.spend", spend_limit_minor=100, actor="ops")
    assert budget.currency == "USD" and Budget.objects.get(pk=budget.pk).currency == "USD"
    with transaction.atomic():
        budgets.reserve(kind="tests.spend", queue="default", tenant="", estimate_minor=100)
    with pytest.raises(BudgetExhausted, match="spend limit 100 USD"), transaction.atomic():
        budgets.reserve(kind="tests.spend", queue="default", tenant="", estimate_minor=1)
    for currency in ("EUR", "eur", "XYZ"):
        with pytest.raises(SafetyError, match=r"budgets are in KOALA_COST_CURRENCY \(USD\)"):
            budgets.create_budget(name=f"b-{currency}", scope="global", currency=currency, actor="ops")
    assert budgets.create_budget(name="said-usd", scope="global", currency="usd", actor="ops").currency == "USD"
    assert list(Budget.objects.order_by("name").values_list("name", flat=True)) == ["said-usd", "usd"]
    with pytest.raises(CommandError, match=r"KOALA_COST_CURRENCY \(USD\)"):
        call_command("koala_budget", "create", "b-cli", "--scope", "global", "--currency", "EUR")
    capsys.readouterr()
    call_command("koala_budget", "list")
    assert "reserved 100 USD" in capsys.readouterr().out


def test_exhausted_budget_parks_jobs_and_a_raised_limit_resumes_them(tmp_path: Path, redis_clean: None) -> None:
    budget = budgets.create_budget(name="daily", scope="kind", target="tests.spend", spend_limit_minor=250, actor="ops")
    world = str(tmp_path / "world.log")
    ids = [enqueue(kind="tests.spend", input={"world": world, "cost": 100, "n": n, "seconds": 0}).job_id for n in range(4)]
    for _ in range(3):
        drain()
    states = sorted(Job.objects.filter(pk__in=ids).values_list("state", flat=True))
    assert states == ["parked", "parked", "succeeded", "succeeded"]
    parked = Job.objects.filter(pk__in=ids, state="parked").first()
    assert parked is not None and parked.park_reason == "budget" and "spend limit 250" in parked.park_detail
    assert budgets.unpark_ready() == 0  # still no room: the jobs stay parked, no churn
    usage = BudgetUsage.objects.get(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor) == (200, 0)

    budgets.update_budget(budget_id=budget.pk, actor="ops", spend_limit_minor=400)
    assert budgets.unpark_ready() == 2
    for _ in range(3):
        drain()
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"succeeded"}
    assert len(world_effects(world)) == 4
    usage.refresh_from_db()
    budget.refresh_from_db()
    assert usage.spent_minor == 400 == budget.spend_limit_minor


def test_budget_exhaustion_can_trip_a_pause_of_its_scope(tmp_path: Path, redis_clean: None) -> None:
    budgets.create_budget(name="tight", scope="queue", target="default", request_limit=1, pause_on_exhaust=True, actor="ops")
    world = str(tmp_path / "world.log")
    ids = [enqueue(kind="tests.spend", input={"world": world, "cost": 1, "n": n, "seconds": 0}).job_id for n in range(2)]
    drain()
    assert sorted(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == ["parked", "succeeded"]
    live = pauses.active_pauses()
    assert [(p.scope, p.target, p.source) for p in live] == [("queue", "default", "budget")]


@pytest.mark.django_db  # services only: nothing is claimed, nothing needs committing
def test_model_usage_is_priced_from_the_price_table() -> None:
    budgets.set_model_price(model="m-small", input_minor_per_mtok=300, output_minor_per_mtok=1500, actor="ops")
    assert budgets.price_usage({"model": "m-small", "input_tokens": 1_000_000, "output_tokens": 2_000_000}) == 3300
    assert budgets.price_usage({"model": "m-small", "input_tokens": 10, "output_tokens": 10}) == 1  # rounded up
    assert budgets.price_usage({"model": "unknown", "input_tokens": 10}) is None


# -- pauses ----------------------------------------------------------------------------------------


def test_paused_scopes_are_not_claimed_and_resume_runs_them(tmp_path: Path, redis_clean: None) -> None:
    log = str(tmp_path / "steady.log")
    job_id = enqueue(kind="tests.steady", input={"log": log, "seconds": 0}).job_id
    for scope, target in (("global", ""), ("queue", "default"), ("kind", "tests.steady")):
        row = pauses.pause(scope=scope, target=target, reason="maintenance", actor="ops")
        assert drain() == 0
        assert Job.objects.get(pk=job_id).state == "queued"
        pauses.resume(pause_id=row.pk, actor="ops")
    assert drain() == 1
    assert Job.objects.get(pk=job_id).state == "succeeded"


def test_a_tenant_pause_holds_that_tenants_jobs_only(tmp_path: Path, redis_clean: None) -> None:
    def steady(tenant: str) -> int:
        return enqueue(kind="tests.steady", input={"log": str(tmp_path / f"{tenant}.log"), "seconds": 0, "tenant": tenant}).job_id

    row = pauses.pause(scope="kind", target="tests.steady", tenant="acme", mode="stop", reason="acme's incident", actor="ops")
    acme, globex = steady("acme"), steady("globex")
    # Heartbeats of acme's running attempts are told to stop; globex's are not.
    assert pauses.stop_requested(kind="tests.steady", queue="default", tenant="acme")
    assert not pauses.stop_requested(kind="tests.steady", queue="default", tenant="globex")
    assert not pauses.stop_requested(kind="tests.steady", queue="default", tenant="")
    # Workers do not skip the kind for everyone: only acme's job is held.
    assert drain() == 1
    assert list(Job.objects.filter(pk__in=[acme, globex]).order_by("pk").values_list("state", flat=True)) == [
        "queued",
        "succeeded",
    ]
    # The same tenant may be paused in another scope, and every tenant in this one, at once.
    everyone = pauses.pause(scope="queue", target="default", reason="deploy", actor="ops")
    with pytest.raises(SafetyError, match=r"tenant acme .*already paused"):
        pauses.pause(scope="kind", target="tests.steady", tenant="acme", reason="again", actor="ops")
    pauses.resume(pause_id=everyone.pk, actor="ops")
    pauses.resume(pause_id=row.pk, actor="ops")
    assert drain() == 1 and Job.objects.get(pk=acme).state == "succeeded"


def test_a_tenant_pause_over_the_worker_api(tmp_path: Path, redis_clean: None) -> None:
    """The HTTP protocol's claim and heartbeat (api.protocol) honour a tenant's pause the same way."""
    from api import protocol

    # Registered as an HTTP worker registers (its row is what every claim reads, under its lock).
    worker = protocol.register(
        key_prefix="",
        name="http-1",
        hostname="test",
        pid=1,
        served_kinds=[("tests.steady", 1, [])],
        queues=["default"],
        concurrency=4,
    )

    def steady(tenant: str) -> int:
        return enqueue(kind="tests.steady", input={"log": str(tmp_path / "s.log"), "seconds": 0, "tenant": tenant}).job_id

    steady("acme"), steady("globex")
    running = {lease.tenant: lease for lease in protocol.claim_for(worker, count=2, state=protocol.claim_pass())}
    assert sorted(running) == ["acme", "globex"]
    pauses.pause(scope="kind", target="tests.steady", tenant="acme", mode="stop", reason="acme's incident", actor="ops")
    beats = {
        tenant: protocol.heartbeat(held=leases.lease_of(attempt_id=lease.attempt_id), progress=None)  # type: ignore[arg-type]
        for tenant, lease in running.items()
    }
    assert (beats["acme"]["cancel"], beats["acme"]["reason"], beats["globex"]["cancel"]) == (True, "stop_pause", False)
    # A new pass claims globex's next job of the kind and leaves acme's queued.
    later = {tenant: steady(tenant) for tenant in ("acme", "globex")}
    claimed = protocol.claim_for(worker, count=2, state=protocol.claim_pass())
    assert [lease.job_id for lease in claimed] == [later["globex"]]
    assert Job.objects.get(pk=later["acme"]).state == "queued"


@pytest.mark.parametrize(
    ("tenant", "message"),
    [(" acme", "no spaces around"), ("a" * 101, "at most 100"), ("ac\x00me", "NUL"), ("   ", "no spaces around")],
)
def test_a_pauses_tenant_is_checked(tenant: str, message: str) -> None:
    with pytest.raises(SafetyError, match=message):
        pauses.pause(scope="global", tenant=tenant, reason="bad tenant", actor="ops")
    assert not Pause.objects.exists()


def test_an_expired_pause_no_longer_holds_work(tmp_path: Path, redis_clean: None) -> None:
    job_id = enqueue(kind="tests.steady", input={"log": str(tmp_path / "s.log"), "seconds": 0}).job_id
    row = pauses.pause(scope="global", reason="short", actor="ops", expires_at=timezone.now() + timedelta(minutes=5))
    assert drain() == 0
    # Five minutes later, without waiting them out: the expiry is now behind PostgreSQL's clock.
    Pause.objects.filter(pk=row.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert drain() == 1 and Job.objects.get(pk=job_id).state == "succeeded"
    assert pauses.lift_expired() == 1
    row.refresh_from_db()
    assert row.lifted_by == "expiry"


# -- the review gate -------------------------------------------------------------------------------


def test_critical_charge_waits_for_a_second_person_and_charges_once(tmp_path: Path, redis_clean: None, reviewers: object) -> None:
    job_id = charge(tmp_path, created_by="alice", amount=6000)
    job = run_until(job_id, "parked")
    assert (job.park_reason, job.attempts) == ("waiting_review", 0)
    assert effects(tmp_path) == []
    review = ReviewRequest.objects.get(job_id=job_id)
    assert (review.state, review.amount_minor, review.requested_by) == ("pending", 6000, "alice")

    with pytest.raises(SafetyError, match="four-eyes"):
        approve_review(review_id=review.pk, actor="alice")
    approve_review(review_id=review.pk, actor="bob", comment="ok")
    with pytest.raises(SafetyError, match="already approved"):
        approve_review(review_id=review.pk, actor="bob")
    job = run_until(job_id, "succeeded")
    assert len(effects(tmp_path)) == 1
    review.refresh_from_db()
    assert (review.state, review.decided_by) == ("used", "bob")
    actions = list(AuditEvent.objects.filter(target_type="review", target_id=str(review.pk)).values_list("action", flat=True))
    assert "review.approve" in actions


def test_small_amounts_are_not_critical(tmp_path: Path, redis_clean: None) -> None:
    job_id = charge(tmp_path, created_by="alice", amount=4999)
    run_until(job_id, "succeeded")
    assert not ReviewRequest.objects.exists()


def test_a_changed_amount_needs_a_new_approval(tmp_path: Path, redis_clean: None, reviewers: object) -> None:
    amount_file = tmp_path / "amount"
    amount_file.write_text("6000")
    job_id = charge(tmp_path, created_by="alice", amount_file=str(amount_file))
    run_until(job_id, "parked")
    first = ReviewRequest.objects.get(job_id=job_id)
    approve_review(review_id=first.pk, actor="bob")
    amount_file.write_text("9000")  # the action changed after it was approved
    job = run_until(job_id, "parked")
    assert job.park_reason == "waiting_review"
    first.refresh_from_db()
    second = ReviewRequest.objects.get(job_id=job_id, state="pending")
    assert first.state == "superseded" and second.amount_minor == 9000 and second.digest != first.digest
    assert effects(tmp_path) == []
    approve_review(review_id=second.pk, actor="bob")
    run_until(job_id, "succeeded")
    assert [int(e[2]) for e in effects(tmp_path)] == [9000]


def test_rejection_ends_the_job_and_expiry_is_enforced(tmp_path: Path, redis_clean: None, reviewers: object) -> None:
    rejected = charge(tmp_path, created_by="alice", amount=7000, customer="c-r")
    expiring = charge(tmp_path, created_by="alice", amount=8000, customer="c-e")
    run_until(rejected, "parked")
    run_until(expiring, "parked")
    review = ReviewRequest.objects.get(job_id=rejected)
    with pytest.raises(SafetyError, match="comment"):
        reject_review(review_id=review.pk, actor="bob", comment=" ")
    reject_review(review_id=review.pk, actor="bob", comment="customer disputes this")
    job = Job.objects.get(pk=rejected)
    assert (job.state, job.failure_reason) == ("failed", "review_rejected")
    assert "customer disputes this" in job.error_message

    late = ReviewRequest.objects.get(job_id=expiring)
    ReviewRequest.objects.filter(pk=late.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(SafetyError, match="expired"):
        approve_review(review_id=late.pk, actor="bob")
    assert expire_reviews() == 1
    job = Job.objects.get(pk=expiring)
    assert (job.state, job.failure_reason) == ("failed", "review_expired")
    assert effects(tmp_path) == []


def test_the_beat_expires_reviews_through_the_reviews_apps_beat_task(tmp_path: Path, redis_clean: None) -> None:
    from workers.services.maintenance import safety_tick

    job_id = charge(tmp_path, created_by="alice", amount=8000, customer="c-beat")
    run_until(job_id, "parked")
    assert safety_tick().tasks["reviews"] == {"expired": 0}
    ReviewRequest.objects.filter(job_id=job_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    report = safety_tick()
    assert report.tasks["reviews"] == {"expired": 1}
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason, job.error_class) == ("failed", "review_expired", "ReviewExpired")
    in_order = ["reviews", "exports", "traces", "flows", "schedules", "metrics"]
    assert list(report.tasks) == in_order, "beat tasks run in INSTALLED_APPS order"


def test_fail_parked_changes_only_a_job_still_parked_for_that_reason(tmp_path: Path, redis_clean: None) -> None:
    from workers.services.jobs import fail_parked

    job_id = charge(tmp_path, created_by="alice", amount=6000, customer="c-fp")
    queued = Job.objects.get(pk=job_id)
    ending = {"reason": "review_rejected", "message": "no", "error_class": "ReviewRejected"}
    assert fail_parked(job_id=job_id, park_reason="waiting_review", **ending) is False
    assert Job.objects.get(pk=job_id).state == queued.state == "queued"
    run_until(job_id, "parked")
    assert fail_parked(job_id=job_id, park_reason="budget", **ending) is False
    assert Job.objects.get(pk=job_id).state == "parked"
    message = "rejected: api_key=sk_live_abcdefghijklmnopqrstuv"
    assert fail_parked(job_id=job_id, park_reason="waiting_review", **(ending | {"message": message})) is True
    job = Job.objects.get(pk=job_id)
    assert (job.state, job.failure_reason, job.park_reason) == ("failed", "review_rejected", None)
    assert job.error_class == "ReviewRejected"
    assert "sk_live_" not in job.error_message and job.finished_at is not None
    assert fail_parked(job_id=job_id, **ending) is False, "a terminal job never changes"
    assert effects(tmp_path) == []


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.django_db  # services only: nothing is claimed, nothing needs committing
def test_bad_input_gets_a_clear_error_and_changes_nothing() -> None:
    with pytest.raises(SafetyError, match="unknown scope 'planet'"):
        budgets.create_budget(name="x", scope="planet", actor="ops")
    with pytest.raises(SafetyError, match="cannot be negative"):
        budgets.create_budget(name="x", scope="global", spend_limit_minor=-5, actor="ops")
    with pytest.raises(SafetyError, match="needs a target"):
        budgets.create_budget(name="x", scope="queue", actor="ops")
    with pytest.raises(SafetyError, match="unknown time zone"):
        budgets.create_budget(name="x", scope="global", timezone="Mars/Olympus", actor="ops")
    with pytest.raises(SafetyError, match="review 999999 does not exist"):
        approve_review(review_id=999999, actor="bob")
    with pytest.raises(SafetyError, match="does not exist"):
        resolve_operation(operation_id=999999, happened=False, note="n", actor="ops")
    with pytest.raises(SafetyError, match="needs a reason"):
        pauses.pause(scope="global", reason=" ", actor="ops")
    with pytest.raises(CommandError, match="unknown scope 'planet'"):
        call_command("koala_budget", "create", "y", "--scope", "planet")
    with pytest.raises(CommandError, match="cannot be negative"):
        call_command("koala_budget", "create", "y", "--scope", "global", "--spend", "-1")
    with pytest.raises(CommandError, match="does not exist"):
        call_command("koala_reviews", "approve", "424242", "--actor", "bob")
    assert not Budget.objects.exists() and not Pause.objects.exists()
    assert not AuditEvent.objects.exists()


@pytest.mark.parametrize(
    ("scope", "target", "message"),
    [
        ("queue", "nope", "unknown queue 'nope'"),
        ("kind", "nope", "unknown job kind 'nope'"),
        ("planet", "mars", "unknown scope 'planet'"),
    ],
)
def test_a_person_may_only_pause_or_budget_what_koala_knows(scope: str, target: str, message: str) -> None:
    """The rule sits in the services, so the console, the admin and the commands all keep it."""
    with pytest.raises(SafetyError, match=message):
        pauses.pause(scope=scope, target=target, reason="maintenance", actor="ops")
    with pytest.raises(SafetyError, match=message):
        budgets.create_budget(name="b", scope=scope, target=target, spend_limit_minor=5, actor="ops")
    assert not Budget.objects.exists() and not Pause.objects.exists() and not AuditEvent.objects.exists()


def test_a_kind_this_process_does_not_serve_may_be_paused_while_its_jobs_exist(redis_clean: None) -> None:
    """A kind another deployment registers still has jobs here: an operator may hold them."""
    job_id = enqueue(kind="noop", input={}).job_id
    Job.objects.filter(pk=job_id).update(kind="retired.kind")
    row = pauses.pause(scope="kind", target="retired.kind", reason="hold the old jobs", actor="ops")
    assert row.target == "retired.kind"


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"spend_limit_minor": 10**20}, "spend_limit_minor must be at most 9223372036854775807"),
        ({"concurrency_limit": 3_000_000_000}, "concurrency_limit must be at most 2147483647"),
        ({"request_limit": "1e3"}, "request_limit must be a whole number"),
    ],
)
def test_budget_limits_beyond_their_columns_are_refused(limits: dict[str, object], message: str) -> None:
    with pytest.raises(SafetyError, match=message):
        budgets.create_budget(name="b", scope="global", actor="ops", **limits)
    budget = budgets.create_budget(name="b", scope="global", actor="ops")
    with pytest.raises(SafetyError, match=message):
        budgets.update_budget(budget_id=budget.pk, actor="ops", **limits)
    with pytest.raises(SafetyError, match="at most 9223372036854775807"):
        budgets.set_model_price(model="m", input_minor_per_mtok=10**20, output_minor_per_mtok=1, actor="ops")


@pytest.mark.django_db  # services only: nothing is claimed, nothing needs committing
def test_pausing_a_paused_scope_is_refused() -> None:
    pauses.pause(scope="queue", target="default", reason="deploy", actor="ops")
    with pytest.raises(SafetyError, match="already paused"):
        pauses.pause(scope="queue", target="default", reason="again", actor="ops")
    assert Pause.objects.count() == 1


# -- the commands ----------------------------------------------------------------------------------


def test_pause_resume_and_reviews_commands(
    tmp_path: Path, redis_clean: None, reviewers: object, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("koala_pause", "--queue", "default", "--mode", "stop", "--reason", "incident 42", "--actor", "ops")
    call_command("koala_pause")
    out = capsys.readouterr().out
    assert "queue default stop (manual) by ops" in out and "incident 42" in out
    with pytest.raises(CommandError, match="needs a reason"):
        call_command("koala_pause", "--kind", "noop")
    call_command("koala_resume", "--queue", "default", "--note", "fixed", "--actor", "ops")
    with pytest.raises(CommandError, match="not paused"):
        call_command("koala_resume", "--queue", "default")
    assert pauses.active_pauses() == []
    # One tenant's pause: listed with its tenant, lifted by naming it (the scope alone says which to add).
    call_command("koala_pause", "--kind", "noop", "--tenant", "acme", "--reason", "acme's incident", "--actor", "ops")
    assert "kind noop tenant acme paused (drain)" in capsys.readouterr().out
    call_command("koala_pause")
    assert "kind noop tenant acme drain (manual) by ops" in capsys.readouterr().out
    with pytest.raises(CommandError, match=r"kind noop is not paused \(paused for tenant acme: add --tenant\)"):
        call_command("koala_resume", "--kind", "noop")
    call_command("koala_resume", "--kind", "noop", "--tenant", "acme", "--actor", "ops")
    assert "kind noop tenant acme resumed" in capsys.readouterr().out
    assert pauses.active_pauses() == []

    job_id = charge(tmp_path, created_by="alice", amount=6000)
    run_until(job_id, "parked")
    review = ReviewRequest.objects.get(job_id=job_id)
    capsys.readouterr()
    call_command("koala_reviews", "list")
    listing = capsys.readouterr().out
    assert f"review {review.pk}" in listing and "amount 6000 EUR" in listing and "requested by alice" in listing
    with pytest.raises(CommandError, match="four-eyes"):
        call_command("koala_reviews", "approve", str(review.pk), "--actor", "alice")
    call_command("koala_reviews", "approve", str(review.pk), "--actor", "bob", "--comment", "fine")
    assert "approved by bob" in capsys.readouterr().out
    run_until(job_id, "succeeded")
    assert len(effects(tmp_path)) == 1

    call_command("koala_budget", "create", "ops-daily", "--scope", "queue", "--target", "default", "--spend", "5000")
    call_command("koala_budget", "set", "ops-daily", "--spend", "none", "--requests", "10")
    call_command("koala_budget", "list")
    out = capsys.readouterr().out
    assert "ops-daily: queue default (request_limit=10)" in out


def test_cancelling_a_job_waiting_for_review_withdraws_the_review(tmp_path: Path, redis_clean: None, reviewers: object) -> None:
    from workers.services.jobs import cancel_job

    job_id = charge(tmp_path, created_by="alice", amount=6000)
    run_until(job_id, "parked")
    review = ReviewRequest.objects.get(job_id=job_id)
    cancel_job(job_id=job_id, actor="ops", reason="customer cancelled")
    review.refresh_from_db()
    assert review.state == "superseded"
    with pytest.raises(SafetyError, match="already superseded"):
        approve_review(review_id=review.pk, actor="bob")
    assert effects(tmp_path) == []


@pytest.mark.django_db  # services only: nothing is claimed, nothing needs committing
def test_kinds_can_refuse_an_operator_retry_with_advice(redis_clean: None) -> None:
    from exports.services import EXPORT_KIND
    from workers.errors import JobStateError
    from workers.services.jobs import cancel_job, retry_job

    kind = kinds.latest(EXPORT_KIND)
    job_id = enqueue(kind=EXPORT_KIND, input={"export_id": 1}).job_id
    cancel_job(job_id=job_id, actor="ops", reason="api_key=sk_live_abcdefghijklmnopqrstuv")
    assert "sk_live_" not in Job.objects.get(pk=job_id).error_message  # a pasted secret is not stored
    with pytest.raises(JobStateError, match="request a new export instead"):
        retry_job(job_id=job_id, actor="ops")
    assert kind.retry_instead and Job.objects.count() == 1


def test_a_tenant_budget_limits_only_that_tenant(tmp_path: Path, redis_clean: None) -> None:
    budget = budgets.create_budget(
        name="acme-daily", scope="kind", target="tests.spend", tenant="acme", spend_limit_minor=100, actor="ops"
    )
    world = str(tmp_path / "world.log")

    def spend(tenant: str, n: int) -> int:
        return enqueue(kind="tests.spend", input={"world": world, "cost": 100, "n": n, "seconds": 0, "tenant": tenant}).job_id

    first, second, other = spend("acme", 1), spend("acme", 2), spend("globex", 3)
    for _ in range(3):
        drain()
    states = dict(Job.objects.filter(pk__in=[first, second, other]).values_list("id", "state"))
    assert sorted([states[first], states[second]]) == ["parked", "succeeded"]  # acme: one spend of 100 fits
    assert states[other] == "succeeded"  # globex is not acme's budget
    assert BudgetUsage.objects.get(budget=budget).spent_minor == 100
    assert len(world_effects(world)) == 2


def test_budget_parked_jobs_resume_when_the_period_rolls_over(tmp_path: Path, redis_clean: None) -> None:
    budget = budgets.create_budget(
        name="daily-100", scope="kind", target="tests.spend", timezone="Asia/Tokyo", spend_limit_minor=100, actor="ops"
    )
    world = str(tmp_path / "world.log")
    ids = [enqueue(kind="tests.spend", input={"world": world, "cost": 100, "n": n, "seconds": 0}).job_id for n in range(2)]
    for _ in range(3):
        drain()
    parked = Job.objects.get(pk__in=ids, state="parked")
    today = budgets.period_for(budget)
    assert parked.parked_on["period"] == today.isoformat()
    assert budgets.unpark_ready() == 0

    # Midnight in Tokyo: what was spent and parked now belongs to yesterday.
    yesterday = today - timedelta(days=1)
    BudgetUsage.objects.filter(budget=budget).update(period=yesterday)
    Job.objects.filter(pk=parked.pk).update(parked_on={**parked.parked_on, "period": yesterday.isoformat()})
    assert budgets.unpark_ready() == 1
    run_until(parked.pk, "succeeded")
    usage = {u.period: u.spent_minor for u in BudgetUsage.objects.filter(budget=budget)}
    assert usage == {yesterday: 100, today: 100}


def test_attempt_and_run_time_limits_park_at_claim_time(tmp_path: Path, redis_clean: None) -> None:
    log = str(tmp_path / "steady.log")
    budget = budgets.create_budget(name="tries", scope="kind", target="tests.steady", attempt_limit=2, actor="ops")
    ids = [enqueue(kind="tests.steady", input={"log": log, "seconds": 0, "n": n}).job_id for n in range(3)]
    for _ in range(3):
        drain()
    assert sorted(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == ["parked", "succeeded", "succeeded"]
    parked = Job.objects.get(pk__in=ids, state="parked")
    assert parked.attempts == 0 and "attempt limit 2 reached" in parked.park_detail
    assert BudgetUsage.objects.get(budget=budget).attempts == 2

    budgets.update_budget(budget_id=budget.pk, actor="ops", attempt_limit=None, run_seconds_limit=0)
    assert budgets.unpark_ready() == 1
    drain()
    parked.refresh_from_db()
    assert parked.state == "parked" and "run-time limit 0s reached" in parked.park_detail
