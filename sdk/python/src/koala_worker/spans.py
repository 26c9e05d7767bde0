"""A body's spans: timed, nested, carrying attributes and token usage (sent on complete)."""

from __future__ import annotations

import secrets
import threading
from datetime import UTC, datetime
from typing import Any

USAGE_COUNTS = ("input_tokens", "output_tokens")


def new_span_id() -> str:
    return secrets.token_hex(8)


def add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """The sum of two usages ``{"model", "input_tokens", "output_tokens"}``.

    Token counts add. Koala prices a usage with one model, so a sum over two models keeps the
    first model's name and marks ``mixed_models`` (the caller decides whether it can be sent).
    """
    if not more:
        return dict(total) if total else None
    if not total:
        return dict(more)
    summed = dict(total)
    for key in USAGE_COUNTS:
        summed[key] = int(total.get(key) or 0) + int(more.get(key) or 0)
    if more.get("model") and total.get("model") and more["model"] != total["model"]:
        summed["mixed_models"] = True
    elif more.get("model") and not total.get("model"):
        summed["model"] = more["model"]
    if more.get("mixed_models"):
        summed["mixed_models"] = True
    return summed


def usage_of(model: str, input_tokens: int, output_tokens: int) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": int(input_tokens), "output_tokens": int(output_tokens)}
    if model:
        usage["model"] = model
    return usage


def _attribute(value: Any) -> Any:
    def scalar(item: Any) -> bool:
        return isinstance(item, str | bool | int) or (isinstance(item, float) and item == item and abs(item) != float("inf"))

    if isinstance(value, list | tuple) and len(value) <= 64 and all(scalar(item) for item in value):
        return [item[:4096] if isinstance(item, str) else item for item in value]
    if scalar(value):
        return value[:4096] if isinstance(value, str) else value
    return str(value)[:4096]


def _now() -> str:
    return datetime.now(UTC).isoformat()


class Span:
    """``with ctx.span("model.call") as s: s.set_usage(...); s.set_attribute(k, v)``."""

    def __init__(self, recorder: SpanRecorder, name: str, parent: Span | None, parent_id: str) -> None:
        self.recorder = recorder
        self.name = name
        self.parent = parent
        self.span_id = new_span_id()
        self.parent_id = parent_id
        self.start = ""
        self.end = ""
        self.attributes: dict[str, Any] = {}
        self.own_usage: dict[str, Any] | None = None
        self.child_usage: dict[str, Any] | None = None
        self.error = ""

    def set_attribute(self, key: str, value: Any) -> None:
        """Koala takes strings, numbers, booleans and lists of them (OpenTelemetry's attribute
        values); anything else is sent as its text, so one odd value never refuses the report."""
        self.attributes[str(key)[:100]] = _attribute(value)

    def set_usage(self, *, model: str = "", input_tokens: int = 0, output_tokens: int = 0) -> None:
        """This span's own usage (replaces an earlier set_usage on it; children's usage adds on top)."""
        self.own_usage = usage_of(model, input_tokens, output_tokens)

    @property
    def usage(self) -> dict[str, Any] | None:
        """Own usage plus every descendant's."""
        return add_usage(self.own_usage, self.child_usage)

    def __enter__(self) -> Span:
        self.start = _now()
        self.recorder._push(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.end = _now()
        if exc is not None:
            self.error = type(exc).__name__
        self.recorder._pop(self)

    def as_wire(self) -> dict[str, Any]:
        span: dict[str, Any] = {
            "span_id": self.span_id,
            "name": self.name,
            "start": self.start,
            "end": self.end or self.start,
            "attributes": dict(self.attributes, **({"error": self.error} if self.error else {})),
        }
        if self.parent_id:
            span["parent_id"] = self.parent_id
        if self.own_usage:
            # Its own usage only: Koala sums every span's usage into the step's, so a parent that
            # carried its children's too would count them twice. ``Span.usage`` is the rolled-up view.
            span["usage"] = dict(self.own_usage)
        return span


class SpanRecorder:
    """The spans of one attempt. Nesting is per thread (a body's helper threads open their own top level)."""

    MAX_SPANS = 1000  # the contract's limit on one completion

    def __init__(self, root_span_id: str) -> None:
        self.root_span_id = root_span_id
        self.finished: list[Span] = []
        self.dropped = 0
        self._stack = threading.local()
        self._lock = threading.Lock()
        self.total: dict[str, Any] | None = None  # the sum of the top-level spans' usage

    def _current(self) -> list[Span]:
        stack: list[Span] | None = getattr(self._stack, "spans", None)
        if stack is None:
            stack = self._stack.spans = []
        return stack

    def span(self, name: str) -> Span:
        stack = self._current()
        parent = stack[-1] if stack else None
        return Span(self, name, parent, parent.span_id if parent else self.root_span_id)

    def _push(self, span: Span) -> None:
        self._current().append(span)

    def _pop(self, span: Span) -> None:
        stack = self._current()
        if stack and stack[-1] is span:
            stack.pop()
        with self._lock:
            if span.parent is not None:
                span.parent.child_usage = add_usage(span.parent.child_usage, span.usage)
            else:
                self.total = add_usage(self.total, span.usage)
            if len(self.finished) < self.MAX_SPANS:
                self.finished.append(span)
            else:
                self.dropped += 1

    def wire(self) -> list[dict[str, Any]]:
        with self._lock:
            return [span.as_wire() for span in self.finished]
