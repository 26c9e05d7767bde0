"""``ctx.operation`` has the ledger's options as its own typed signature, and hands every one on."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pytest

from workers import context
from workers.context import JobContext
from workers.kinds import JobKind
from workers.ledger import ABSENT, OperationResult, _Ledger
from workers.models import Delivery
from workers.services.leases import Lease


def _body(ctx: Any, data: dict[str, Any]) -> None:
    return None


class Runtime:
    name = "unit-runtime"
    shutdown_requested = threading.Event()
    lease_seconds = 30.0

    def beat(self, ctx: JobContext) -> None:
        return None


def a_context() -> JobContext:
    lease = Lease(
        job_id=5,
        attempt_id=9,
        kind="t.op",
        version=1,
        queue="default",
        input={"tenant": "acme"},
        run_state={},
        progress={},
        lease_token=2,
        attempts=1,
        max_attempts=3,
        delivery=Delivery.AT_LEAST_ONCE,
        timeout_seconds=30.0,
        deadline_at=None,
        correlation_id="c",
        trace_id="t",
        idempotency_key="order-5",
        created_by="",
        operation_key_base="",
    )
    return JobContext(lease, JobKind(name="t.op", version=1, body=_body), Runtime())


def test_the_signature_is_the_ledgers_options_one_by_one() -> None:
    ours = list(inspect.signature(JobContext.operation).parameters.values())[1:]  # after self
    ledgers = list(inspect.signature(_Ledger.__init__).parameters.values())[2:]  # after self, ctx
    assert [(p.name, p.kind, p.default, p.annotation) for p in ours] == [
        (p.name, p.kind, p.default, p.annotation) for p in ledgers
    ]
    assert [p.name for p in ours if p.kind is not inspect.Parameter.KEYWORD_ONLY] == ["name"]
    assert inspect.signature(JobContext.operation).return_annotation == "dict[str, Any]"


def test_every_option_reaches_the_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def run_operation(ctx: JobContext, name: str, **options: Any) -> dict[str, Any]:
        seen.update(options, ctx=ctx, name=name)
        return {"ok": True}

    monkeypatch.setattr(context, "run_operation", run_operation)
    ctx = a_context()

    def perform(key: str) -> OperationResult:
        return OperationResult(external_id=key)

    def reconcile(key: str) -> Any:
        return ABSENT

    # Every option with a value other than its default: one that were not handed on would show.
    given: dict[str, Any] = {
        "kind": "charge",
        "params": {"amount_minor": 1200},
        "perform": perform,
        "reconcile": reconcile,
        "key": "order-5:charge:v2",
        "estimate_minor": 1200,
        "amount_minor": 1200,
        "currency": "EUR",
        "target": "cus_1",
        "tenant": "globex",
    }
    defaults = {p.name: p.default for p in inspect.signature(JobContext.operation).parameters.values()}
    assert set(given) == set(defaults) - {"self", "name"}
    assert all(given[option] != defaults[option] for option in given)
    assert ctx.operation("charge", **given) == {"ok": True}
    assert seen == {**given, "ctx": ctx, "name": "charge"}


def test_an_unknown_option_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "run_operation", lambda *args, **kwargs: pytest.fail("the ledger ran"))
    with pytest.raises(TypeError, match="amount"):
        a_context().operation("charge", kind="charge", params={}, perform=lambda key: OperationResult(), amount=5)  # type: ignore[call-arg]
