"""Spans without services: the attempt's span id, a body's nesting, what a span may carry, the
worker protocol's checks of reported spans, stored spans as OpenTelemetry spans, the headers setting."""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import StatusCode

from api import protocol
from api.http import ApiError
from koala import env
from koala.env import ConfigError
from traces.otlp import StoredSpan, readable, traces_url
from workers.spans import SpanError, SpanRecorder, attempt_span_id, check_attributes

STEP = "f" * 16


def test_an_attempts_span_id_is_stable_per_attempt_and_differs_between_attempts() -> None:
    first = attempt_span_id(trace_id="a" * 32, job_id=7, lease_token=1)
    assert first == attempt_span_id(trace_id="a" * 32, job_id=7, lease_token=1)
    assert first == hashlib.sha256(f"{'a' * 32}:7:1".encode()).hexdigest()[:16]  # what leases always carried
    assert (
        len(
            {
                first,
                attempt_span_id(trace_id="a" * 32, job_id=7, lease_token=2),
                attempt_span_id(trace_id="a" * 32, job_id=8, lease_token=1),
            }
        )
        == 3
    )


def test_spans_nest_by_their_blocks_and_another_threads_start_at_the_top() -> None:
    spans = SpanRecorder(STEP)
    with spans.open("outer", {"k": 1}) as outer:
        with spans.open("inner", {}) as inner:
            inner.add_usage(input_tokens=2, model="m")
            inner.add_usage(input_tokens=3)

            def helper() -> None:
                with spans.open("helper", {}):
                    pass

            thread = threading.Thread(target=helper)
            thread.start()
            thread.join()
        outer.set(done=True)
    with pytest.raises(KeyError), spans.open("raises", {}):
        raise KeyError("x")
    done = {span.name: span for span in spans.finished()}
    assert done["outer"].parent_id == STEP and done["inner"].parent_id == outer.span_id
    assert done["helper"].parent_id == STEP
    assert done["inner"].usage == {"input_tokens": 5, "model": "m"}
    assert done["outer"].attributes == {"k": 1, "done": True}
    assert done["raises"].error == "KeyError" and done["outer"].error == ""
    assert done["outer"].started_at <= done["inner"].started_at <= done["inner"].ended_at <= done["outer"].ended_at


def test_past_the_limit_spans_are_counted_not_kept() -> None:
    spans = SpanRecorder(STEP, limit=3)
    for index in range(5):
        with spans.open(f"s{index}", {}):
            pass
    assert len(spans.finished()) == 3 and spans.dropped == 2


@pytest.mark.parametrize(
    ("attributes", "named"),
    [
        ({"x": {"nested": 1}}, "attributes.x"),
        ({"x": float("nan")}, "attributes.x"),
        ({"x": "a" * 5000}, "attributes.x"),
        ({"": 1}, "attribute names"),
        ({f"k{i}": i for i in range(65)}, "at most 64"),
        ({"x": [None]}, "attributes.x"),
    ],
)
def test_attributes_that_opentelemetry_cannot_carry_are_refused_by_name(attributes: dict, named: str) -> None:
    with pytest.raises(SpanError) as refused:
        check_attributes(attributes)
    assert named in str(refused.value)
    with pytest.raises(SpanError):
        SpanRecorder(STEP).open("n", attributes).__enter__()


def test_a_span_needs_a_name_and_usage_of_known_fields() -> None:
    spans = SpanRecorder(STEP)
    with pytest.raises(SpanError, match="name"):
        spans.open("", {}).__enter__()
    with spans.open("ok", {"tags": ["a", "b"], "n": 1.5, "flag": False}) as span, pytest.raises(SpanError, match="unknown"):
        span.add_usage(dollars=3)
    assert spans.finished()[0].attributes == {"tags": ["a", "b"], "n": 1.5, "flag": False}


def _refused(spans: list) -> str:
    with pytest.raises(ApiError) as refused:
        protocol.check_spans(spans, step_span=STEP)
    assert refused.value.status == 400
    return refused.value.message


def test_reported_spans_are_checked_strictly() -> None:
    assert "cycle" in _refused(
        [{"span_id": "a" * 16, "parent_id": "b" * 16, "name": "a"}, {"span_id": "b" * 16, "parent_id": "a" * 16, "name": "b"}]
    )
    assert "unknown field" in _refused([{"span_id": "a" * 16, "name": "a", "colour": "red"}])
    assert "spans[0].attributes.x" in _refused([{"span_id": "a" * 16, "name": "a", "attributes": {"x": {"deep": 1}}}])
    assert "all zeros" in _refused([{"span_id": "0" * 16, "name": "a"}])
    now = datetime.now(UTC)
    assert "before its start" in _refused(
        [{"span_id": "a" * 16, "name": "a", "start": now.isoformat(), "end": (now - timedelta(seconds=1)).isoformat()}]
    )
    assert "bytes of spans" in _refused(
        [{"span_id": f"{i:016x}", "name": "n" * 200, "attributes": {"t": "x" * 4000}} for i in range(1, 300)]
    )
    assert "spans[0].error" in _refused([{"span_id": "a" * 16, "name": "a", "error": 3}])
    [checked] = protocol.check_spans([{"span_id": "a" * 16, "name": "a", "error": "Boom"}], step_span=STEP)
    [body] = protocol.body_spans([checked])
    assert (body.parent_id, body.error, body.started_at) == (STEP, "Boom", None)


def test_a_stored_span_becomes_an_opentelemetry_span_with_its_ids_times_and_usage() -> None:
    start = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    stored = StoredSpan(
        id=1,
        trace_id="1" * 32,
        span_id="2" * 16,
        parent_id="3" * 16,
        kind="body",
        name="model_call complete",
        started_at=start,
        ended_at=start + timedelta(milliseconds=250),
        attributes={"koala.operation.kind": "model_call", "odd": {"a": 1}, "tags": ["x"]},
        usage={"input_tokens": 11, "output_tokens": 5, "cost_minor": 7, "model": "tiny"},
        error="Timeout",
        job_id=9,
    )
    span = readable(stored, resource=Resource.create({"service.name": "koala"}))
    assert span.context.trace_id == int("1" * 32, 16) and span.context.span_id == int("2" * 16, 16)
    assert span.parent is not None and span.parent.span_id == int("3" * 16, 16)
    assert span.end_time - span.start_time == 250_000_000
    assert span.attributes["gen_ai.usage.input_tokens"] == 11 and span.attributes["gen_ai.request.model"] == "tiny"
    assert span.attributes["koala.cost_minor"] == 7 and span.attributes["odd"] == '{"a": 1}'
    assert list(span.attributes["tags"]) == ["x"] and span.status.status_code is StatusCode.ERROR
    root = readable(StoredSpan(**{**stored.__dict__, "parent_id": "", "trace_id": "", "error": ""}), resource=span.resource)
    assert root.parent is None and root.status.status_code is StatusCode.UNSET
    assert root.context.trace_id == int(hashlib.sha256(b"koala-job:9").hexdigest()[:32], 16)  # a row without a trace id


def test_the_endpoint_is_a_base_url_and_the_headers_setting_is_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    assert traces_url("http://c:4318") == traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
    monkeypatch.setenv("X_HEADERS", "x-api-key=s%3Dcret, tenant=acme")
    assert env.headers("X_HEADERS") == {"x-api-key": "s=cret", "tenant": "acme"}
    for bad in ("novalue", "bad name=1", "x=", "x=a%0Ab"):
        monkeypatch.setenv("X_HEADERS", f"ok=1,{bad}")
        with pytest.raises(ConfigError) as refused:
            env.headers("X_HEADERS")
        assert "X_HEADERS" in str(refused.value) and "a%0Ab" not in str(refused.value)
