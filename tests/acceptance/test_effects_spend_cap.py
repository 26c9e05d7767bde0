"""The spend cap under real concurrency (issue 9, scenario 3): six worker subprocesses race
token-priced model calls of every density against one hard cap (tests/integration/test_effects_spend_cap.py
has the in-process cases and the helpers shared with them)."""

from __future__ import annotations

from typing import Any

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.conftest import wait_for
from tests.integration.test_effects_spend_cap import PRICE_IN, PRICE_OUT, billed_minor, prompt
from tests.support.effects import effects_env
from tests.support.fleet import assert_engine_invariants, wait_workers_ready
from workers.models import BudgetUsage, Job, Operation, Pause
from workers.services import budgets
from workers.services.jobs import JobSpec, enqueue_many

# transaction=True: real worker subprocesses, and bodies run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def settled(ids: list[int], budget: Any, cap: int) -> bool:
    """Nothing can move any more: nothing queued or running, nothing reserved, and every parked
    job needs more room than the cap has left (so the beat has nothing left to unpark)."""
    jobs = list(Job.objects.filter(pk__in=ids).values_list("state", "parked_on"))
    if any(state not in ("succeeded", "parked") for state, _ in jobs):
        return False
    usage = BudgetUsage.objects.filter(budget=budget).first()
    if usage is None or usage.reserved_minor != 0:
        return False
    room = cap - usage.spent_minor
    return all(int(on.get("need") or 0) > room for state, on in jobs if state == "parked")


@pytest.mark.slow
def test_concurrent_model_calls_of_every_token_density_never_spend_past_the_cap(processes, provider: FakeProvider) -> None:
    cap = 2000
    budgets.set_model_price(model="m-small", input_minor_per_mtok=PRICE_IN, output_minor_per_mtok=PRICE_OUT, actor="ops")
    budget = budgets.create_budget(name="models-2000", scope="kind", target="model.complete", spend_limit_minor=cap, actor="ops")
    # Hold each call a little at the provider, so several are in flight together.
    provider.fault("slow", resource="completions", seconds=0.3)
    env = effects_env(provider, KOALA_DOORBELL_DEPTH="32")
    workers = [processes.worker("--name", f"cap-{n}", env=env) for n in range(6)]
    beat = processes.beat(env=env)
    wait_workers_ready(workers, timeout=60)

    max_tokens = (16, 32, 48, 64)
    specs = [
        JobSpec(kind="model.complete", input={"model": "m-small", "prompt": prompt(n), "max_tokens": max_tokens[n // 4 % 4]})
        for n in range(32)
    ]
    ids = [r.job_id for r in enqueue_many(specs=specs)]
    wait_for(lambda: settled(ids, budget, cap), timeout=120, interval=0.2, what="every call to finish or park for good")
    beat.terminate()
    beat.wait(timeout=10)
    assert settled(ids, budget, cap)

    usage = BudgetUsage.objects.get(budget=budget)
    billed = provider.events("effect", "completions")
    print(
        f"spend cap {cap}: spent {usage.spent_minor}, {len(billed)} calls billed, "
        f"max in flight {provider.stats()['max_in_flight']['completions']}"
    )
    # The cap held, and nothing is left reserved.
    assert usage.spent_minor <= cap, f"spent {usage.spent_minor} on a cap of {cap}"
    assert usage.reserved_minor == 0
    # The provider's own record of what it billed is exactly Koala's spend, call by call.
    ops = {op.key: op for op in Operation.objects.filter(job_id__in=ids)}
    assert {e["key"] for e in billed} == set(ops)
    assert sum(billed_minor(e["object"]["usage"]) for e in billed) == usage.spent_minor
    for event in billed:
        op = ops[event["key"]]
        assert op.state == "succeeded" and op.cost_minor == billed_minor(event["object"]["usage"])
        assert op.cost_minor <= op.estimate_minor and op.overshoot_minor == 0  # the bound held for every density
    # Every call that did not run is parked on this budget's spend limit, with nothing sent for it.
    jobs = Job.objects.filter(pk__in=ids)
    parked = [j for j in jobs if j.state == "parked"]
    assert len(billed) == jobs.filter(state="succeeded").count() >= 4 and parked
    for job in parked:
        assert job.park_reason == "budget" and job.parked_on["budget_id"] == budget.pk and job.parked_on["limit"] == "spend"
        assert "'models-2000'" in job.park_detail and f"spend limit {cap}" in job.park_detail
    assert not Operation.objects.filter(job__in=parked).exists()
    # Dense and sparse prompts both ran, and the workers really did race for the budget.
    densities = {Job.objects.get(pk=ops[e["key"]].job_id).input["prompt"][0].isdigit() for e in billed}
    assert densities == {True, False}
    assert provider.stats()["max_in_flight"]["completions"] >= 2
    assert not Pause.objects.exists()
    assert_engine_invariants()
