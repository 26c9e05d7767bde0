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

import time

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.acceptance.support import assert_engine_invariants, attempts, wait_workers_ready
from tests.conftest import wait_for
from tests.effects.conftest import effects_env
from tests.inprocess import run_until
from workers.models import Budget, Job, Operation
from workers.services import budgets, operations
from workers.services.jobs import cancel_job, enqueue, retry_job

# transaction=True: real worker subprocesses, and bodies run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)

OPEN = ("in_flight", "uncertain")
# The provider commits the charge this long after accepting it: longer than lease (3 s) + grace
# (0.5 s) + the five 1-second retries with which today's code gave up.
PROCESSING_SECONDS = 12.0
# What the payment client declares as the provider's processing window (must cover the above).
WINDOW_SECONDS = "20"


def shop(reference: str, amount: int = 1200) -> int:
    data = {"reference": reference, "amount_minor": amount, "currency": "EUR"}
    return enqueue(kind="shop.order_and_charge", input=data, idempotency_key=f"shop-{reference}").job_id


def spend_budget() -> Budget:
    return budgets.create_budget(
        name="shop-spend", scope="kind", target="shop.order_and_charge", spend_limit_minor=1_000_000, actor="test"
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill_9", "client_timeout"])
def test_a_charge_the_provider_is_still_processing_is_never_recorded_as_absent(
    processes, provider: FakeProvider, how: str
) -> None:
    budget = spend_budget()
    provider.fault("processing", resource="charges", seconds=PROCESSING_SECONDS, times=1)
    env = effects_env(
        provider,
        # kill_9: the worker waits for the answer and dies; client_timeout: it gives up after 1 s.
        KOALA_PAYMENTS_TIMEOUT_SECONDS="120" if how == "kill_9" else "1",
        KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS=WINDOW_SECONDS,
    )
    first = processes.worker("--name", "proc-a", env=env)
    processes.beat(env=env)
    wait_workers_ready([first])

    job_id = shop(f"o-proc-{how}")
    wait_for(lambda: provider.accepted("charges"), timeout=20, what="the provider to accept the charge")
    accepted_at = time.monotonic()
    if how == "kill_9":
        first.kill()
        first.wait(timeout=10)
        processes.worker("--name", "proc-b", env=env)

    # Sample Koala's record of the charge until the job settles: at no moment may it say "did not
    # happen" (failed / absent), and while it is open its reservation is held.
    seen: list[tuple[float, str, str, bool, bool]] = []

    def settled() -> bool:
        job = Job.objects.get(pk=job_id)
        op = Operation.objects.filter(key=f"shop-o-proc-{how}:charge").first()
        if op is not None:
            charged = bool(provider.effects("charges"))
            seen.append((time.monotonic() - accepted_at, op.state, op.resolution, bool(op.reservations), charged))
        return job.state in ("succeeded", "failed", "cancelled", "parked")

    wait_for(settled, timeout=90, interval=0.1, what="the job to settle")
    job = Job.objects.get(pk=job_id)
    # The provider commits the charge whatever Koala concluded (today: after the job had failed).
    [charge] = wait_for(lambda: provider.effects("charges"), timeout=30, what="the charge to commit")  # type: ignore[misc]
    states = {s[1] for s in seen}
    outcome = f"job {job.state}/{job.failure_reason}, op states {sorted(states)}, last samples {seen[-3:]}"
    assert "failed" not in states and "absent" not in {s[2] for s in seen}, f"recorded as not happened: {outcome}"
    assert all(held for (_, state, _, held, _) in seen if state in OPEN), "the reservation was released while open"
    assert (job.state, job.failure_reason) == ("succeeded", None), (job.state, job.failure_reason, job.error_message)

    op = Operation.objects.get(key=f"shop-o-proc-{how}:charge")
    assert (op.state, op.resolution, op.external_id, op.attempts) == ("reconciled", "found", charge["id"], 1)
    assert job.result["charge"] == charge["id"]
    # Sent once; never re-sent under the key while the provider was processing it.
    assert [r["outcome"] for r in provider.requests("charges")] == ["accepted"]
    lookups = [e["status"] for e in provider.lookups("charges")]
    assert 404 in lookups and lookups[-1] == 200, lookups  # misses inside the window proved nothing
    # Waiting for the provider used no attempts: the send's attempt and the one that found it.
    assert job.attempts <= 2, [(a.outcome, a.error_message) for a in attempts(job_id)]
    assert seen[-1][0] >= PROCESSING_SECONDS - 1, "settled only once the provider had committed"
    usage = budgets.usage_for(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor) == (1200, 0)
    assert len(provider.effects("orders")) == 1
    assert_engine_invariants()


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
