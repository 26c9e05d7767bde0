"""A body's spans: ids, nesting under the lease's span, usage rolled up into parents and the step."""

from __future__ import annotations

import re
import threading

import pytest
from koala_worker import Client, Lease, StopRequested, Worker
from koala_worker.errors import Abandon
from koala_worker.worker import LeaseRun

from tests.unit.test_api_sdk_lease import LEASE

HEX16 = re.compile(r"^[0-9a-f]{16}$")


def _ctx():
    worker = Worker(Client("http://127.0.0.1:9", "k"), concurrency=1)
    run = LeaseRun(worker, Lease.parse(LEASE))
    return run, run.ctx


def test_top_level_spans_go_under_the_leases_span_and_children_under_their_parent() -> None:
    _, ctx = _ctx()
    with ctx.span("agent") as outer:
        with ctx.span("model.call") as inner:
            inner.set_attribute("temperature", 0.2)
    with ctx.span("store"):
        pass
    spans = {span["name"]: span for span in ctx.spans.wire()}
    assert set(spans) == {"agent", "model.call", "store"}
    assert spans["agent"]["parent_id"] == LEASE["span_id"]
    assert spans["store"]["parent_id"] == LEASE["span_id"]
    assert spans["model.call"]["parent_id"] == outer.span_id
    assert spans["model.call"]["attributes"] == {"temperature": 0.2}
    ids = [span["span_id"] for span in spans.values()]
    assert all(HEX16.match(i) for i in ids) and len(set(ids)) == 3
    assert spans["agent"]["start"] <= spans["model.call"]["start"] <= spans["model.call"]["end"] <= spans["agent"]["end"]


def test_a_childs_usage_adds_into_its_parents_and_the_step_total() -> None:
    _, ctx = _ctx()
    with ctx.span("agent") as agent:
        agent.set_usage(model="m", input_tokens=1, output_tokens=2)
        with ctx.span("plan") as plan:
            with ctx.span("model.call") as call:
                call.set_usage(model="m", input_tokens=100, output_tokens=10)
            with ctx.span("model.call") as call:
                call.set_usage(model="m", input_tokens=50, output_tokens=5)
    with ctx.span("summary") as summary:
        summary.set_usage(model="m", input_tokens=7, output_tokens=3)
    assert plan.usage == {"model": "m", "input_tokens": 150, "output_tokens": 15}
    assert agent.usage == {"model": "m", "input_tokens": 151, "output_tokens": 17}
    assert ctx.step_usage() == {"model": "m", "input_tokens": 158, "output_tokens": 20}
    # On the wire each span carries its own usage (Koala sums them all); the step's is not sent
    # unless set_usage said so: Koala's sum is the same number, priced span by span.
    wire = {span["span_id"]: span for span in ctx.spans.wire()}
    assert wire[agent.span_id]["usage"] == {"model": "m", "input_tokens": 1, "output_tokens": 2}
    assert "usage" not in wire[plan.span_id]
    assert sum(span.get("usage", {}).get("input_tokens", 0) for span in wire.values()) == 158
    assert ctx.wire_usage() is None


def test_set_usage_on_the_step_wins_over_the_spans() -> None:
    _, ctx = _ctx()
    with ctx.span("model.call") as call:
        call.set_usage(model="m", input_tokens=5, output_tokens=5)
    ctx.set_usage(model="gpt-x", input_tokens=1200, output_tokens=300)
    assert ctx.step_usage() == {"model": "gpt-x", "input_tokens": 1200, "output_tokens": 300}
    assert ctx.wire_usage() == {"model": "gpt-x", "input_tokens": 1200, "output_tokens": 300}


def test_no_spans_no_usage_and_two_models_stay_on_their_spans() -> None:
    _, ctx = _ctx()
    assert ctx.step_usage() is None and ctx.wire_usage() is None
    with ctx.span("a") as a:
        a.set_usage(model="m1", input_tokens=1, output_tokens=1)
    with ctx.span("b") as b:
        b.set_usage(input_tokens=1, output_tokens=1)
        b.set_usage(model="m2", input_tokens=2, output_tokens=1)  # replaces the first
    assert ctx.step_usage() == {"model": "m1", "input_tokens": 3, "output_tokens": 2, "mixed_models": True}
    assert [span["usage"] for span in ctx.spans.wire()] == [
        {"model": "m1", "input_tokens": 1, "output_tokens": 1},
        {"model": "m2", "input_tokens": 2, "output_tokens": 1},
    ]


def test_past_the_span_limit_the_steps_sum_is_sent_so_no_usage_is_lost() -> None:
    _, ctx = _ctx()
    for _ in range(1001):
        with ctx.span("call") as call:
            call.set_usage(model="m", input_tokens=1, output_tokens=0)
    assert ctx.wire_usage() == {"model": "m", "input_tokens": 1001, "output_tokens": 0}


def test_a_span_records_the_error_class_that_ended_it() -> None:
    _, ctx = _ctx()
    with pytest.raises(ZeroDivisionError), ctx.span("divide"):
        1 / 0
    [span] = ctx.spans.wire()
    assert span["attributes"] == {"error": "ZeroDivisionError"}


def test_spans_opened_in_another_thread_start_their_own_top_level() -> None:
    _, ctx = _ctx()
    with ctx.span("main"):
        thread = threading.Thread(target=lambda: ctx.span("helper").__enter__().__exit__(None, None, None))
        thread.start()
        thread.join()
    spans = {span["name"]: span for span in ctx.spans.wire()}
    assert spans["helper"]["parent_id"] == LEASE["span_id"]


def test_at_most_the_contracts_thousand_spans_are_sent() -> None:
    _, ctx = _ctx()
    for _ in range(1005):
        with ctx.span("tick"):
            pass
    assert len(ctx.spans.wire()) == 1000
    assert ctx.spans.dropped == 5


def test_progress_state_and_checkpoints() -> None:
    run, ctx = _ctx()
    assert ctx.progress_checkpoint == {"page": 3}
    assert (ctx.job_id, ctx.attempt, ctx.idempotency_key, ctx.correlation_id) == (771, 2, "koala-job-771", "corr-1")
    ctx.progress(page=4)
    ctx.progress(page=5, cursor="c")
    assert ctx.take_progress() == {"page": 5, "cursor": "c"}
    assert ctx.take_progress() is None
    ctx.restore_progress({"page": 5})
    assert ctx.take_progress() == {"page": 5}
    ctx.set_state(a=2)
    ctx.set_state(b=3)
    assert ctx.state_delta == {"a": 2, "b": 3}
    ctx.checkpoint()  # nothing asked: no stop
    run.request_stop()
    assert ctx.cancelled.is_set()
    with pytest.raises(StopRequested):
        ctx.checkpoint()
    run.reject("lease_superseded")
    with pytest.raises(Abandon, match="lease_superseded"):
        ctx.checkpoint()
    assert not run.claim_report()  # a lost lease is never reported
