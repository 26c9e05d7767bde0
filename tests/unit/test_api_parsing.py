"""The worker API's parsing edge, without services: JSON bodies, fields, spans, failure messages."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import RequestFactory

from api import http, protocol
from api.http import ApiError

STEP = "0123456789abcdef"


def body(raw: bytes) -> dict[str, Any]:
    request = RequestFactory().post("/api/v1/x", data=raw, content_type="application/json")
    return http.json_body(request)


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"{oops", 400, "not valid JSON"),
        (b"[1]", 400, "must be a JSON object"),
        (b'{"a": NaN}', 400, "NaN is not a JSON number"),
        (b'{"a": 1e999}', 400, "too large"),
        (b'{"a": "x\\u0000y"}', 400, "NUL"),
        (b'{"a": "\\ud800"}', 400, "lone surrogate"),
        (b"\xff\xfe", 400, "not UTF-8"),
        (b'{"a": "' + b"x" * (1024 * 1024) + b'"}', 413, "at most"),
    ],
)
def test_a_body_that_cannot_be_stored_is_refused_with_its_reason(raw: bytes, status: int, fragment: str) -> None:
    with pytest.raises(ApiError) as refused:
        body(raw)
    assert refused.value.status == status and fragment in refused.value.message


def test_an_empty_body_is_an_empty_object_and_fields_are_typed() -> None:
    assert body(b"") == {}
    data = body(b'{"n": 3, "b": true, "s": "x", "o": {}}')
    assert http.integer(data, "n", minimum=1, maximum=5) == 3
    assert http.boolean(data, "b") is True and http.text(data, "s") == "x" and http.obj(data, "o") == {}
    for call in (
        lambda: http.integer(data, "b", minimum=0, maximum=9),  # a bool is not an integer
        lambda: http.integer(data, "n", minimum=4, maximum=9),
        lambda: http.text(data, "n"),
        lambda: http.text(data, "missing"),
        lambda: http.obj(data, "s"),
        lambda: http.boolean(data, "n"),
    ):
        with pytest.raises(ApiError) as refused:
            call()
        assert refused.value.status == 400 and refused.value.code == "invalid_request"


def test_spans_must_hang_under_the_step_span_with_ids_of_their_own() -> None:
    top = {"span_id": "a" * 16, "name": "model.call"}
    child = {"span_id": "b" * 16, "parent_id": "a" * 16, "name": "parse", "usage": {"input_tokens": 2}}
    checked = protocol.check_spans([child, top], step_span=STEP)  # a child may come before its parent
    assert [s["parent_id"] for s in checked] == ["a" * 16, STEP]
    for spans, field in (
        ([{"span_id": "A" * 16, "name": "x"}], "span_id"),
        ([{"span_id": STEP, "name": "x"}], "span_id"),
        ([top, top], "span_id"),
        ([{"span_id": "c" * 16, "parent_id": "d" * 16, "name": "x"}], "parent_id"),
        ([{"span_id": "c" * 16, "name": ""}], "name"),
        ([{"span_id": "c" * 16, "name": "x", "start": "yesterday"}], "start"),
        ([{"span_id": "c" * 16, "name": "x", "start": "2026-12-01T10:00:00"}], "start"),  # no offset
        ([{"span_id": "c" * 16, "name": "x", "usage": {"input_tokens": -1}}], "input_tokens"),
        ([{"span_id": "c" * 16, "name": "x", "usage": {"tokens": 1}}], "usage"),
    ):
        with pytest.raises(ApiError) as refused:
            protocol.check_spans(spans, step_span=STEP)
        assert field in refused.value.message, (spans, refused.value.message)


def test_a_failure_message_never_keeps_a_stack_trace() -> None:
    assert protocol.message_only("boom") == "boom"
    text = 'card declined\nTraceback (most recent call last):\n  File "x.py", line 1\nValueError'
    assert protocol.message_only(text) == "card declined"
    assert protocol.message_only('Traceback (most recent call last):\n  File "x"') == "(a stack trace was sent and dropped)"
    assert len(protocol.message_only("x" * 10_000)) == protocol.MAX_MESSAGE_CHARS


def test_usage_set_explicitly_wins_over_the_spans_and_unpriced_tokens_are_counted() -> None:
    spans = [{"usage": {"input_tokens": 3, "output_tokens": 4, "cost_minor": 7}}, {"usage": {"input_tokens": 1, "cost_minor": 2}}]
    assert protocol._usage(None, spans) == {"input_tokens": 4, "output_tokens": 4, "cost_minor": 9}
    assert protocol._usage({"input_tokens": 10, "output_tokens": 0, "cost_minor": 5}, spans) == {
        "input_tokens": 10,
        "output_tokens": 0,
        "cost_minor": 5,
    }
