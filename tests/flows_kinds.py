"""Workflow definitions used only by the tests (imported with tests.kinds: tests/conftest.py, worker_env).

``fan`` is a three-step fan-out/fan-in: ``a`` then ``b`` and ``c`` (in parallel) then ``d`` after
both. Each body appends a line to the effect file named in the input (the outside world's record
of how many times it ran) and returns what it saw, so a test checks each lease's ``steps``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tests.kinds import _world_charge, _world_lookup, effect
from workers import JobContext, OperationResult, Retryable, workflow

fan = workflow("fan", version=1, required_fields={"log"})


def _mark(ctx: JobContext, data: dict[str, Any]) -> None:
    effect(data["log"], f"{ctx.step} {ctx.run_id} {ctx.job_id} {ctx.attempt} {os.getpid()}")
    pause = data.get("pause", {}).get(ctx.step)
    if pause:
        time.sleep(float(pause))


@fan.step("a")
def fan_a(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    ctx.set_state(stage="a", a=1)
    return {"step": "a", "seen": sorted(ctx.steps)}


@fan.step("b", after=["a"])
def fan_b(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    if data.get("fail") == "b":
        raise ValueError("b was told to fail")
    ctx.set_state(stage="b", b=2)
    return {"step": "b", "seen": ctx.steps, "state": ctx.run_state}


@fan.step("c", after=["a"])
def fan_c(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    if data.get("huge") == "c":
        ctx.set_state(blob="x" * 70_000)
    ctx.set_state(stage="c", c=3)
    return {"step": "c", "seen": ctx.steps, "state": ctx.run_state}


@fan.step("d", after=["b", "c"])
def fan_d(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    ctx.set_state(stage="d")
    return {"step": "d", "seen": ctx.steps, "state": ctx.run_state}


# A version of ``fan`` no test worker serves at first (tests add it to a worker's served kinds).
fan_v2 = workflow("fan", version=2, required_fields={"log"})


@fan_v2.step("a")
def fan2_a(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    ctx.set_state(stage="a2")
    return {"step": "a", "version": 2}


@fan_v2.step("b", after=["a"])
def fan2_b(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    return {"step": "b", "version": 2}


@fan_v2.step("c", after=["a"])
def fan2_c(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    return {"step": "c", "version": 2}


@fan_v2.step("d", after=["b", "c"])
def fan2_d(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    return {"step": "d", "version": 2, "seen": ctx.steps}


# A support ticket: classify, wait for a reviewer's signal, then send. ``on_timeout`` per test.
ticket = workflow("ticket", version=1, required_fields={"log"})


@ticket.step("classify")
def ticket_classify(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    ctx.set_state(label="billing")
    return {"label": "billing"}


ticket.wait("approval", event="reviewer.approved", after=["classify"], timeout_seconds=3600)


@ticket.step("send", after=["approval"])
def ticket_send(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    return {"sent": True, "approval": ctx.steps["approval"]}


# Waits whose timeout follows each policy (the beat resolves them; tests shorten nothing: 0.2 s).
for _policy in ("continue", "skip", "fail"):
    _w = workflow(f"wait_{_policy}", version=1, required_fields={"log"})
    _w.wait("signal", event="go", timeout_seconds=0.2, on_timeout=_policy)

    @_w.step("after", after={"signal": "skip"} if _policy == "skip" else ["signal"])
    def _after(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
        _mark(ctx, data)
        return {"seen": ctx.steps}

    @_w.step("last", after={"after": "continue"})
    def _last(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
        _mark(ctx, data)
        return {"seen": ctx.steps}


# A step that charges through the ledger against the world file (tests/kinds.py: one effect per
# key, as a provider keeps it), critical above 10 000 minor units: a larger charge parks the step
# for a reviewer's approval.
pay = workflow("pay", version=1, required_fields={"log", "world", "amount"})


@pay.step("charge", max_attempts=3, backoff_base=0.05, backoff_cap=0.1, critical={"charge": {"above_minor": 10_000}})
def pay_charge(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    world, amount = data["world"], int(data["amount"])

    def perform(key: str) -> OperationResult:
        effect(world, f"call {key} {ctx.attempt} {os.getpid()}")
        _world_charge(world, key, amount)
        return OperationResult(external_id=f"ch_{key[-12:]}", data={"charged": amount}, cost_minor=amount)

    result = ctx.operation(
        "charge",
        kind="charge",
        params={"amount_minor": amount},
        perform=perform,
        reconcile=lambda key: _world_lookup(world, key),
        estimate_minor=amount,
        amount_minor=amount,
        currency="EUR",
        target="cus_1",
    )
    if data.get("retry_after_charge") and ctx.attempt < 2:
        raise Retryable("charged; now fail once after it: the retry must not charge again")
    ctx.set_state(charged=amount)
    return {"charged": result}


@pay.step("receipt", after=["charge"])
def pay_receipt(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    return {"receipt_for": ctx.steps["charge"]}


# A run whose input carries a secret (``api_key`` is always sensitive): the body records a span
# naming it, repeats it in the state, its output and an error, and the console's journal must
# mask it everywhere (tests/integration/test_console_runs.py).
secretive = workflow("secretive", version=1, required_fields={"log", "api_key"})


@secretive.step("use")
def secretive_use(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    with ctx.span("lookup", note=f"called with {data['api_key']}") as span:
        with ctx.span("inner", depth="two"):
            pass
        span.add_usage(input_tokens=12, output_tokens=3)
    ctx.add_usage(input_tokens=12, output_tokens=3)
    ctx.set_state(echo=f"key was {data['api_key']}")
    return {"said": data["api_key"]}


secretive.wait("go", event="go", after=["use"], timeout_seconds=3600)


@secretive.step("fail", after=["go"], max_attempts=1)
def secretive_fail(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    raise ValueError(f"refused {data['api_key']}")


# Workflows served over HTTP (tests/acceptance/test_flows_http.py): the steps' bodies live in SDK
# workers (tests/support/flow_worker.py), their contracts here.
# ``hfan``: the fan-out/fan-in of ``fan``, every step remote; version 2 has the same steps.
for _version in (1, 2):
    _h = workflow("hfan", version=_version, required_fields={"log"})
    _h.remote_step("a", max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
    _h.remote_step("b", after=["a"], max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
    _h.remote_step("c", after=["a"], max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
    _h.remote_step("d", after=["b", "c"], max_attempts=3, backoff_base=0.05, backoff_cap=0.1)

# ``hmix``: ``a`` has its body here (an RQ worker runs it), ``b``, ``c`` and ``d`` are remote.
hmix = workflow("hmix", version=1, required_fields={"log"})


@hmix.step("a")
def hmix_a(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    _mark(ctx, data)
    ctx.set_state(stage="a", a=1, runtime="rq")
    return {"step": "a", "seen": sorted(ctx.steps), "pid": os.getpid()}


hmix.remote_step("b", after=["a"])
hmix.remote_step("c", after=["a"])
hmix.remote_step("d", after=["b", "c"])

# ``hwait``: a remote step, a wait for ``go``, then a remote step; signals and cancels over HTTP.
hwait = workflow("hwait", version=1, required_fields={"log"})
hwait.remote_step("work", max_attempts=2, backoff_base=0.05, backoff_cap=0.1)
hwait.wait("gate", event="go", after=["work"], timeout_seconds=3600)
hwait.remote_step("finish", after=["gate"])
