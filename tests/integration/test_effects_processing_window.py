"""A provider that is still processing (issue 9, scenario 2), and operator retries of jobs whose
operations exist.

The provider accepts a charge and commits it seconds later (the ``processing`` fault of
devtools/sandbox/provider.py): meanwhile a lookup by key misses (404) or says "processing" (202), and a
re-send under the key gets 409 ``idempotency_key_in_use``. Koala must never record "did not happen"
for that charge: the operation stays open with its reservation held, is reconciled again later
without using the job's attempts, and goes to a person when the provider's own contract (its
declared processing window) cannot settle it.

Effects are counted in the provider's own record (its state file); Koala's side on its rows.
"""

from __future__ import annotations

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.conftest import wait_for
from tests.inprocess import run_until
from workers.models import Budget, Operation
from workers.services import budgets, operations
from workers.services.jobs import cancel_job, enqueue, retry_job

# transaction=True: bodies run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def shop(reference: str, amount: int = 1200) -> int:
    data = {"reference": reference, "amount_minor": amount, "currency": "EUR"}
    return enqueue(kind="shop.order_and_charge", input=data, idempotency_key=f"shop-{reference}").job_id


def spend_budget() -> Budget:
    return budgets.create_budget(
        name="shop-spend", scope="kind", target="shop.order_and_charge", spend_limit_minor=1_000_000, actor="test"
    )


def test_a_provider_processing_past_its_window_and_the_wait_bound_goes_to_a_person(
    provider: FakeProvider, redis_clean: None, settings
) -> None:
    # The provider says "processing" (202) for longer than it promised (window 1 s) plus the
    # ledger's patience (2 s): the job is parked for a person, the charge stays open, not failed.
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS = 1.0
    settings.KOALA_RECONCILE_MAX_WAIT_SECONDS = 2.0
    budget = spend_budget()
    provider.fault("processing", resource="charges", seconds=8, lookup="processing", times=1)
    job_id = shop("o-late")
    job = run_until(job_id, "parked", "failed", "succeeded", timeout=20)
    assert (job.state, job.park_reason) == ("parked", "needs_attention"), (job.state, job.error_message)
    op = Operation.objects.get(key="shop-o-late:charge")
    assert op.state == "uncertain" and op.reservations, (op.state, op.reservations)
    assert list(operations.needing_attention()) == [op]
    assert budgets.usage_for(budget=budget).reserved_minor == 1200
    lookups = [e["status"] for e in provider.lookups("charges")]
    assert lookups and set(lookups) == {202}, lookups
    assert len(lookups) <= 6, f"waits back off: {lookups}"
    assert job.attempts == 1, "waiting for the provider used no attempt"
    assert [r["outcome"] for r in provider.requests("charges")] == ["accepted"]

    # The provider commits it after all; the person finds it there and says so.
    [charge] = wait_for(lambda: provider.effects("charges"), timeout=15, what="the late commit")
    operations.resolve_operation(
        operation_id=op.pk, happened=True, external_id=charge["id"], note="settled in the provider dashboard", actor="ops"
    )
    job = run_until(job_id, "succeeded")
    assert job.result["charge"] == charge["id"]
    assert len(provider.effects("charges")) == 1 and len(provider.requests("charges")) == 1
    usage = budgets.usage_for(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor) == (1200, 0)


def test_an_operator_retry_of_a_cancelled_job_reuses_its_operation_keys_and_never_charges_twice(
    provider: FakeProvider, redis_clean: None, settings
) -> None:
    # The charge commits and its answer is lost; the provider offers no lookup, so the job waits
    # for a person, who cancels it instead and later presses "retry".
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    provider.fault("lookup_disabled", resource="charges")
    provider.fault("commit_then_timeout", resource="charges", seconds=2, times=1)
    old = shop("o-retry")
    run_until(old, "parked")
    [charge] = provider.effects("charges")
    assert Operation.objects.get(job_id=old, name="charge").state == "uncertain"
    cancel_job(job_id=old, actor="ops", reason="stuck")
    provider.reset()  # lookups work again

    new = retry_job(job_id=old, actor="ops").job_id
    job = run_until(new, "succeeded")
    assert job.retry_of_id == old
    assert len(provider.effects("charges")) == 1, "the retry charged a second time"
    assert len(provider.effects("orders")) == 1, "the retry created a second order"
    assert len(provider.requests("charges")) == 1, "found by lookup, not re-sent"
    assert job.result["charge"] == charge["id"]
    op = Operation.objects.get(key="shop-o-retry:charge")
    assert (op.state, op.resolution) == ("reconciled", "found")
    assert op.job_id == new, "the open operation moved to the job that settles it"


def test_an_operator_retry_of_a_failed_job_reuses_its_operation_keys(provider: FakeProvider, redis_clean: None) -> None:
    # The order is made, the card is declined: the job fails terminally. After the customer fixes
    # the card an operator retries it: the same order, and the charge re-sent under its own key.
    provider.fault("decline", resource="charges", times=1)
    old = shop("o-declined")
    failed = run_until(old, "failed")
    assert failed.error_class == "TerminalFailure:declined"
    [order] = provider.effects("orders")

    new = retry_job(job_id=old, actor="ops").job_id
    job = run_until(new, "succeeded")
    assert len(provider.effects("orders")) == 1, "the retry created a second order"
    [charge] = provider.effects("charges")
    assert (charge["order"], job.result["order"]) == (order["id"], order["id"])
    assert [e["key"] for e in provider.events("effect")] == ["shop-o-declined:order", "shop-o-declined:charge"]
    # A second retry of the (now succeeded) work is refused by state; a retry of the failed
    # original again reuses the keys and sends nothing.
    again = retry_job(job_id=old, actor="ops").job_id
    run_until(again, "succeeded")
    assert len(provider.effects("charges")) == 1 and len(provider.requests("charges")) == 2  # declined + created
