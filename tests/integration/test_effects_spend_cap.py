"""Issue 9, scenario 3: token-priced model calls under a hard spend cap.

A model call's reservation must be a true upper bound of what the call can cost, so that
concurrent workers cannot push spend past a budget's cap whatever the prompts' token
density; a provider that bills beyond that bound anyway is recorded on the operation,
pauses the budget's scope and shows on the dashboard.

The loopback provider bills tokens by density (devtools.sandbox.provider.count_tokens: digits
and emoji a token a byte, CJK a token a character, prose a token per ~4 bytes), and its own
effect log is the record of what was billed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from devtools.sandbox.provider import FakeProvider
from tests.inprocess import drain, run_until
from tests.support.console import ensure_roles, make_user
from workers.models import BudgetUsage, Job, Operation, Pause
from workers.services import budgets
from workers.services.jobs import enqueue

# transaction=True: bodies run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)

PRICE_IN, PRICE_OUT = 1_000_000, 2_000_000  # minor units per million tokens: 1 a token in, 2 a token out


def billed_minor(usage: dict[str, Any]) -> int:
    """What the provider's own usage record costs at the test's prices (rounded up, like Koala)."""
    return math.ceil((usage["input_tokens"] * PRICE_IN + usage["output_tokens"] * PRICE_OUT) / 1_000_000)


def prompt(n: int) -> str:
    """About 300 UTF-8 bytes of very different token densities, by n % 4."""
    kind = n % 4
    if kind == 0:  # digits: a token a byte
        return "".join(str((n * 7 + i * 3) % 10) for i in range(300))
    if kind == 1:  # emoji: 4 bytes, 4 tokens each (byte fallback)
        return "🙂🚀🎉🧮"[n % 3] * 75
    if kind == 2:  # CJK: 3 bytes, one token each
        return "模型调用预算上限"[n % 5] * 100
    return ("the quick brown fox jumps over the lazy dog " * 7)[:300]  # prose: ~4.5 bytes a token


def test_a_provider_billing_past_the_bound_is_recorded_pauses_the_scope_and_shows_on_the_dashboard(
    provider: FakeProvider, redis_clean: None
) -> None:
    budgets.set_model_price(model="m-small", input_minor_per_mtok=PRICE_IN, output_minor_per_mtok=PRICE_OUT, actor="ops")
    budget = budgets.create_budget(name="models-cap", scope="kind", target="model.complete", spend_limit_minor=5000, actor="ops")
    text = "Summarise the day's orders."  # 27 bytes: bound 27 in + 16 out = 27 + 32 = 59
    provider.fault("overbill", resource="completions", times=1)  # bills 2 tokens a byte: 54 in
    job_id = enqueue(kind="model.complete", input={"model": "m-small", "prompt": text, "max_tokens": 16}).job_id
    job = run_until(job_id, "succeeded")  # the call happened: its result stands

    [billed] = provider.events("effect", "completions")
    op = Operation.objects.get(job_id=job_id)
    assert billed["key"] == op.key and billed["object"]["usage"]["input_tokens"] == 2 * len(text.encode())
    assert op.estimate_minor == 59  # the reservation: the call's upper bound
    assert op.cost_minor == billed_minor(billed["object"]["usage"]) == 54 + 2 * billed["object"]["usage"]["output_tokens"]
    assert op.overshoot_minor == op.cost_minor - op.estimate_minor > 0
    # Spend is what was billed (never hidden), nothing stays reserved.
    usage = BudgetUsage.objects.get(budget=budget)
    assert (usage.spent_minor, usage.reserved_minor) == (op.cost_minor, 0)
    assert job.result["completion"] == billed["object"]["id"]

    # The budget's scope is drain-paused, by the budget, naming the overshoot and the operation.
    pause = Pause.objects.get(lifted_at__isnull=True)
    assert (pause.scope, pause.target, pause.mode, pause.source) == ("kind", "model.complete", "drain", "budget")
    assert f"overshoot of {op.overshoot_minor} minor units by operation {op.pk}" in pause.reason
    assert "'models-cap'" in pause.reason and f"job {job_id}" in pause.reason
    # ...and enforced: the next call of the kind is not claimed.
    later = enqueue(kind="model.complete", input={"model": "m-small", "prompt": "again", "max_tokens": 16}).job_id
    drain()
    assert Job.objects.get(pk=later).state == "queued" and len(provider.events("effect", "completions")) == 1

    # The dashboard names the operation and the amount.
    ensure_roles()
    viewer = Client()
    viewer.force_login(make_user("aude", "auditors"))
    page = viewer.get("/admin/console/")
    assert page.status_code == 200
    board = page.content.decode()
    assert 'id="overshoots"' in board and "1 budget overshoot" in board
    assert f'data-operation="{op.pk}" data-job="{job_id}" data-overshoot="{op.overshoot_minor}"' in board
    # Shown in major units of the cost currency (minor units 27 -> "+0.27 EUR").
    shown = f"{op.overshoot_minor // 100}.{op.overshoot_minor % 100:02d} {settings.KOALA_COST_CURRENCY}"
    assert f"+{shown}" in board


def test_an_overshoot_on_one_tenants_budget_pauses_that_tenant_only(provider: FakeProvider, redis_clean: None) -> None:
    budgets.set_model_price(model="m-small", input_minor_per_mtok=PRICE_IN, output_minor_per_mtok=PRICE_OUT, actor="ops")
    budgets.create_budget(
        name="acme-models", scope="kind", target="model.complete", tenant="acme", spend_limit_minor=5000, actor="ops"
    )
    provider.fault("overbill", resource="completions", times=1)

    def call(tenant: str, text: str) -> int:
        data = {"model": "m-small", "prompt": text, "max_tokens": 16, "tenant": tenant}
        return enqueue(kind="model.complete", input=data).job_id

    first = call("acme", "Summarise the day's orders.")
    run_until(first, "succeeded")
    assert Operation.objects.get(job_id=first).overshoot_minor > 0

    # The pause holds acme's calls of the kind, not the kind for every tenant.
    pause = Pause.objects.get(lifted_at__isnull=True)
    assert (pause.scope, pause.target, pause.tenant, pause.source) == ("kind", "model.complete", "acme", "budget")
    held, other = call("acme", "again"), call("globex", "and for globex")
    drain()
    assert Job.objects.get(pk=other).state == "succeeded"
    assert Job.objects.get(pk=held).state == "queued"
    assert len(provider.events("effect", "completions")) == 2  # acme's first call and globex's

    # The banner says whose work it holds.
    ensure_roles()
    viewer = Client()
    viewer.force_login(make_user("aude", "auditors"))
    banner = viewer.get("/admin/console/").content.decode()
    assert 'id="pause-banner"' in banner and "tenant <code>acme</code>" in banner


def test_a_call_within_its_bound_records_no_overshoot_and_the_dashboard_shows_none(
    provider: FakeProvider, redis_clean: None
) -> None:
    budgets.set_model_price(model="m-small", input_minor_per_mtok=PRICE_IN, output_minor_per_mtok=PRICE_OUT, actor="ops")
    budgets.create_budget(name="models-cap", scope="kind", target="model.complete", spend_limit_minor=5000, actor="ops")
    digits = "4" * 50  # as dense as text gets: a token a byte, exactly the bound
    job_id = enqueue(kind="model.complete", input={"model": "m-small", "prompt": digits, "max_tokens": 16}).job_id
    run_until(job_id, "succeeded")
    op = Operation.objects.get(job_id=job_id)
    assert op.usage["input_tokens"] == 50 and op.estimate_minor == 50 + 2 * 16
    assert op.cost_minor == 50 + 2 * op.usage["output_tokens"] <= op.estimate_minor and op.overshoot_minor == 0
    assert not Pause.objects.exists()
    ensure_roles()
    viewer = Client()
    viewer.force_login(make_user("aude", "auditors"))
    assert 'id="overshoots"' not in viewer.get("/admin/console/").content.decode()


def test_an_unpriced_model_under_a_spend_cap_fails_before_any_call(provider: FakeProvider, redis_clean: None) -> None:
    budgets.create_budget(name="models-cap", scope="kind", target="model.complete", spend_limit_minor=5000, actor="ops")
    job_id = enqueue(kind="model.complete", input={"model": "m-large", "prompt": "hello", "max_tokens": 16}).job_id
    job = run_until(job_id, "failed")
    assert job.failure_reason == "terminal" and "'m-large' has no price" in job.error_message
    assert "'models-cap'" in job.error_message
    assert not Operation.objects.filter(job_id=job_id).exists() and not provider.requests("completions")
