"""Budgets under races from real processes: overlapping scopes never deadlock, and caps hold.

A reservation, a settlement and a release each lock several usage rows, one per budget that
applies. Workers whose jobs are covered by overlapping sets of budgets (global, queue, kind,
tenant) must take those row locks in one order, or two of them can each hold a row the other
waits for: PostgreSQL then aborts one with ``deadlock_detected`` (40P01) after
``deadlock_timeout``, and the call that hit it fails for nothing.
"""

from __future__ import annotations

import random

import pytest
from django.db import transaction

from tests.racers import race
from workers.models import Budget, BudgetUsage
from workers.services import budgets
from workers.services.budgets import BudgetExhausted

# transaction=True: the racing processes must see the budgets this test commits, and each other's locks.
pytestmark = pytest.mark.django_db(transaction=True)

RACERS = 6
ROUNDS = 4
CALLS = 40  # reserve, then settle or release, per racer and round
PER_LEVEL = 2  # budgets per scope and level: a team's, a finance cap, …

# Jobs of two kinds, on two queues, for two tenants: any two of them share some budgets and not others.
JOBS = [
    (kind, queue, tenant)
    for kind in ("tests.spend", "tests.charge")
    for queue in ("default", "bulk")
    for tenant in ("acme", "globex")
]
# Reached part-way through the run, so that refusals race with grants too.
KIND_TENANT_SPEND = 600
QUEUE_REQUESTS = 250


def reserve_and_settle(calls: list[tuple[str, str, str, int, str]]) -> dict[str, int]:
    """One racer's round: for each call, reserve (one transaction), then settle it at half its
    estimate or release it (another transaction), as the ledger does around an outbound call."""
    told = {"granted": 0, "refused": 0, "spent": 0, "refunded": 0}
    for kind, queue, tenant, estimate, ending in calls:
        try:
            with transaction.atomic():
                held = budgets.reserve(kind=kind, queue=queue, tenant=tenant, estimate_minor=estimate)
        except BudgetExhausted:
            told["refused"] += 1
            continue
        told["granted"] += 1
        with transaction.atomic():
            if ending == "settle":
                budgets.settle(reservations=held, actual_minor=estimate // 2)
                told["spent"] += estimate // 2
            else:
                budgets.release(reservations=held, refund_request=ending == "refund")
                told["refunded"] += ending == "refund"
    return told


def _overlapping_budgets() -> list[Budget]:
    """Budgets at every level, the narrow ones created first (a global cap added after the
    per-kind ones): a call reserves on a dozen usage rows, and two calls share some of them,
    but not necessarily their first."""
    made = []
    for n in range(PER_LEVEL):
        for kind in ("tests.spend", "tests.charge"):
            for tenant in ("acme", "globex"):
                made.append(
                    budgets.create_budget(
                        name=f"k-{kind}-{tenant}-{n}",
                        scope="kind",
                        target=kind,
                        tenant=tenant,
                        actor="ops",
                        spend_limit_minor=KIND_TENANT_SPEND,
                    )
                )
        for queue in ("default", "bulk"):
            made.append(
                budgets.create_budget(
                    name=f"q-{queue}-{n}", scope="queue", target=queue, actor="ops", request_limit=QUEUE_REQUESTS
                )
            )
        for tenant in ("acme", "globex"):
            made.append(budgets.create_budget(name=f"{tenant}-{n}", scope="global", tenant=tenant, actor="ops"))
        made.append(budgets.create_budget(name=f"all-{n}", scope="global", actor="ops", spend_limit_minor=1_000_000))
    return made


@pytest.mark.slow  # six spawned processes, about 30 s
def test_workers_on_overlapping_budgets_never_deadlock_and_never_pass_a_cap(redis_clean: None) -> None:
    made = _overlapping_budgets()
    rng = random.Random(18)
    payloads = [
        [
            [(*rng.choice(JOBS), rng.randrange(1, 40), rng.choice(["settle", "release", "refund"])) for _ in range(CALLS)]
            for _ in range(ROUNDS)
        ]
        for _ in range(RACERS)
    ]
    outcomes = race(f"{__name__}:reserve_and_settle", payloads)

    errors = sorted({o.error.split("\n")[0] for o in outcomes if o.error})
    assert not errors, f"{sum(1 for o in outcomes if o.error)} of {len(outcomes)} rounds failed: {errors[:3]}"
    told = {key: sum(o.value[key] for o in outcomes) for key in ("granted", "refused", "spent", "refunded")}
    assert told["refused"] > 0, "no cap was reached: the race did not test the limits"
    # Invariant 7 on the rows: no cap was passed, nothing is left reserved once every call ended,
    # and the budgets that cover every call counted exactly what the callers were granted.
    for budget in made:
        usage = BudgetUsage.objects.get(budget=budget)
        assert usage.reserved_minor == 0, budget.name
        if budget.spend_limit_minor is not None:
            assert usage.spent_minor <= budget.spend_limit_minor, budget.name
        if budget.request_limit is not None:
            assert usage.requests <= budget.request_limit, budget.name
        if budget.name.startswith("all-"):
            assert (usage.spent_minor, usage.requests) == (told["spent"], told["granted"] - told["refunded"]), budget.name
