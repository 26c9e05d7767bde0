"""The engine's side of traces: an attempt's span id, and the spans a body records (``ctx.span``).

Every job has a trace id (``Job.trace_id``, 32 hex); each of its attempts is one span of that
trace whose id is derived from the attempt, never drawn: the same attempt always has the same
span id, so a report repeated after a lost reply, a retry (a new attempt, a new span) and a
reclaim can never make two spans of one attempt. An HTTP worker's lease carries it (``span_id``)
so the spans its body reports hang under it.

A body's own spans (``ctx.span(name, **attributes)``, nested by the ``with`` blocks on one
thread; each ledger operation is one, under the innermost open span) are kept in memory by a
``SpanRecorder`` and handed to the span sinks (``workers.hooks``) in the transaction that
records the attempt's end. The engine stores none of them itself: the ``traces`` app does.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.utils import timezone

from workers.hooks import BodySpan

MAX_SPANS = 1000  # per attempt, as the worker protocol's report (docs/worker-api.md)
MAX_NAME_CHARS = 200
MAX_ATTRIBUTES = 64
MAX_KEY_CHARS = 100
MAX_VALUE_CHARS = 4096
USAGE_FIELDS = ("input_tokens", "output_tokens", "cost_minor")


class SpanError(ValueError):
    """A span's name, attribute or usage is not one Koala can store (a ValueError, raised at once)."""


def attempt_span_id(*, trace_id: str, job_id: int, lease_token: int) -> str:
    """The span of the attempt that holds (or held) job ``job_id`` under fencing token
    ``lease_token``: 16 lowercase hex (W3C trace context), stable for that attempt. The token
    is unique per attempt of a job (``attempt_one_per_lease_token``), and is what the HTTP lease
    has always derived its ``span_id`` from."""
    return hashlib.sha256(f"{trace_id}:{job_id}:{lease_token}".encode()).hexdigest()[:16]


def new_span_id() -> str:
    while True:
        span_id = secrets.token_hex(8)
        if span_id != "0" * 16:  # the all-zero id is invalid in W3C trace context
            return span_id


def check_attributes(attributes: Mapping[str, Any], *, where: str = "attributes") -> dict[str, Any]:
    """Attributes as OpenTelemetry takes them: at most MAX_ATTRIBUTES keys of 1..100 characters,
    each value a string (at most MAX_VALUE_CHARS), a whole number, a finite number, a boolean, or a
    list of one of those. SpanError names the first that is not."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise SpanError(f"{where}: at most {MAX_ATTRIBUTES} attributes per span, not {len(attributes)}")
    checked: dict[str, Any] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_CHARS:
            raise SpanError(f"{where}: attribute names are 1 to {MAX_KEY_CHARS} characters, not {key!r:.120}")
        items = value if isinstance(value, list | tuple) else [value]
        if isinstance(value, list | tuple) and len(value) > MAX_ATTRIBUTES:
            raise SpanError(f"{where}.{key}: a list of at most {MAX_ATTRIBUTES} values")
        for item in items:
            if isinstance(item, str):
                if len(item) > MAX_VALUE_CHARS:
                    raise SpanError(f"{where}.{key}: a text of at most {MAX_VALUE_CHARS} characters")
            elif isinstance(item, float) and not math.isfinite(item):
                raise SpanError(f"{where}.{key}: must be a finite number")
            elif not isinstance(item, bool | int | float):
                raise SpanError(
                    f"{where}.{key}: must be a string, number or boolean (or a list of them), not {type(item).__name__}"
                )
        checked[key] = list(value) if isinstance(value, list | tuple) else value
    return checked


def check_usage(usage: Mapping[str, Any], *, where: str = "usage") -> dict[str, Any]:
    """A span's usage: ``input_tokens``, ``output_tokens``, ``cost_minor`` (whole numbers from 0 to
    10^15) and ``model`` (a name of at most 100 characters)."""
    unknown = sorted(set(usage) - {*USAGE_FIELDS, "model"})
    if unknown:
        raise SpanError(f"{where}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted({*USAGE_FIELDS, 'model'}))}")
    model = usage.get("model")
    if model is not None and (not isinstance(model, str) or len(model) > 100):
        raise SpanError(f"{where}.model: a model name of at most 100 characters")
    for name in USAGE_FIELDS:
        value = usage.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**15):
            raise SpanError(f"{where}.{name}: a whole number between 0 and 10^15")
    return {k: v for k, v in usage.items() if v is not None}


class OpenSpan:
    """The span a ``with ctx.span(...)`` block is in: add attributes or usage while it runs."""

    def __init__(self, span_id: str, parent_id: str, name: str, attributes: dict[str, Any]) -> None:
        self.span_id = span_id
        self.parent_id = parent_id
        self.name = name
        self.attributes = attributes
        self.usage: dict[str, Any] = {}
        self.started_at: datetime = timezone.now()

    def set(self, **attributes: Any) -> None:
        """Add (or replace) attributes of this span."""
        merged = {**self.attributes, **attributes}
        self.attributes = check_attributes(merged)

    def add_usage(self, **usage: Any) -> None:
        """What this span used (``input_tokens``, ``output_tokens``, ``cost_minor``, ``model``): shown on
        the span, not counted on the job (count the body's own with ``ctx.add_usage``)."""
        check_usage(usage)
        for key, value in usage.items():
            if key == "model":
                self.usage["model"] = value
            elif value is not None:
                self.usage[key] = int(self.usage.get(key, 0)) + int(value)


class SpanRecorder:
    """The spans of one attempt's body, in the order they ended. Nesting follows the ``with``
    blocks of each thread: a span opened in another thread starts its own top level, under the
    attempt's span. At most MAX_SPANS are kept; later ones are counted in ``dropped``."""

    def __init__(self, attempt_span_id: str, *, limit: int = MAX_SPANS) -> None:
        self.attempt_span_id = attempt_span_id
        self.limit = limit
        self.dropped = 0
        self._done: list[BodySpan] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def _stack(self) -> list[OpenSpan]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current_id(self) -> str:
        """The innermost open span on this thread, or the attempt's span."""
        stack = self._stack()
        return stack[-1].span_id if stack else self.attempt_span_id

    @contextmanager
    def open(self, name: str, attributes: Mapping[str, Any]) -> Iterator[OpenSpan]:
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise SpanError(f"a span's name is 1 to {MAX_NAME_CHARS} characters, not {name!r:.120}")
        span = OpenSpan(new_span_id(), self.current_id(), name, check_attributes(attributes))
        stack = self._stack()
        stack.append(span)
        error = ""
        try:
            yield span
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            stack.remove(span)
            self._finish(span, error=error)

    def _finish(self, span: OpenSpan, *, error: str) -> None:
        ended = BodySpan(
            span_id=span.span_id,
            parent_id=span.parent_id,
            name=span.name,
            started_at=span.started_at,
            ended_at=timezone.now(),
            attributes=dict(span.attributes),
            usage=dict(span.usage),
            error=error,
        )
        with self._lock:
            if len(self._done) >= self.limit:
                self.dropped += 1
            else:
                self._done.append(ended)

    def finished(self) -> tuple[BodySpan, ...]:
        """The spans that ended (a span still open when the attempt ends is not one)."""
        with self._lock:
            return tuple(self._done)
