"""Stored spans as OpenTelemetry spans, and the OTLP/HTTP exporter that sends them.

Spans are built from rows after the fact (``ReadableSpan`` with the stored ids and times), not
recorded through a live tracer: the rows are the record, and the exporter only copies them out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

HEX_TRACE = re.compile(r"[0-9a-f]{32}")
HEX_SPAN = re.compile(r"[0-9a-f]{16}")
SCOPE = InstrumentationScope("koala", "1")


@dataclass(frozen=True)
class StoredSpan:
    """A traces_span row as the exporter reads it (traces.sql.NEXT_UNEXPORTED's columns)."""

    id: int
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    name: str
    started_at: datetime | None
    ended_at: datetime | None
    attributes: dict[str, Any]
    usage: dict[str, Any]
    error: str
    job_id: int

    @classmethod
    def of(cls, row: Sequence[Any]) -> StoredSpan:
        values = list(row)
        for index in (8, 9):  # attributes, usage: jsonb comes back as text from a raw cursor
            if isinstance(values[index], str | bytes):
                values[index] = json.loads(values[index])
        return cls(*values)


def trace_id_of(span: StoredSpan) -> int:
    """The span's trace id as OTLP wants it: the job's own (32 hex); a job stored without one (a
    row older than trace ids) gets one derived from its id, the same for all its spans."""
    text = (
        span.trace_id
        if HEX_TRACE.fullmatch(span.trace_id or "")
        else hashlib.sha256(f"koala-job:{span.job_id}".encode()).hexdigest()[:32]
    )
    return int(text, 16) or 1


def _nanos(moment: datetime | None) -> int | None:
    return int(moment.timestamp() * 1_000_000) * 1000 if moment is not None else None


def attribute_value(value: Any) -> Any:
    """A stored (JSON) value as an OpenTelemetry attribute: scalars and lists of one scalar type
    as they are, anything else as its JSON text."""
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return value
    if isinstance(value, list) and value and all(isinstance(item, bool) for item in value):
        return value
    if isinstance(value, list) and value and all(isinstance(item, int | float) and not isinstance(item, bool) for item in value):
        return [float(item) for item in value] if any(isinstance(item, float) for item in value) else value
    return json.dumps(value, default=str)[:4096]


def attributes_of(span: StoredSpan) -> dict[str, Any]:
    """The stored attributes plus the span's usage, in OpenTelemetry's GenAI names where they exist."""
    attributes = {str(key): attribute_value(value) for key, value in (span.attributes or {}).items() if value is not None}
    attributes["koala.span.kind"] = span.kind
    usage = span.usage or {}
    for field, name in (("input_tokens", "gen_ai.usage.input_tokens"), ("output_tokens", "gen_ai.usage.output_tokens")):
        if isinstance(usage.get(field), int | float):
            attributes[name] = int(usage[field])
    if isinstance(usage.get("cost_minor"), int | float):
        attributes["koala.cost_minor"] = int(usage["cost_minor"])
        attributes["koala.cost_currency"] = settings.KOALA_COST_CURRENCY
    if isinstance(usage.get("model"), str) and usage["model"]:
        attributes["gen_ai.request.model"] = usage["model"]
    if span.error:
        attributes["error.type"] = span.error
    return attributes


def readable(span: StoredSpan, *, resource: Resource) -> ReadableSpan:
    trace_id = trace_id_of(span)
    sampled = TraceFlags(TraceFlags.SAMPLED)
    span_id = int(span.span_id, 16) if HEX_SPAN.fullmatch(span.span_id) else 1
    parent_id = int(span.parent_id, 16) if HEX_SPAN.fullmatch(span.parent_id or "") else 0
    parent = SpanContext(trace_id=trace_id, span_id=parent_id, is_remote=False, trace_flags=sampled) if parent_id else None
    start = _nanos(span.started_at) or _nanos(span.ended_at)
    end = _nanos(span.ended_at) or start
    return ReadableSpan(
        name=span.name,
        context=SpanContext(trace_id=trace_id, span_id=span_id, is_remote=False, trace_flags=sampled),
        parent=parent,
        resource=resource,
        attributes=attributes_of(span),
        kind=SpanKind.CONSUMER if span.kind == "attempt" else SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, span.error) if span.error else Status(StatusCode.UNSET),
        start_time=start,
        end_time=end,
        instrumentation_scope=SCOPE,
    )


def traces_url(endpoint: str) -> str:
    """The receiver's traces URL: KOALA_OTLP_ENDPOINT is its base (http://collector:4318), as
    OTEL_EXPORTER_OTLP_ENDPOINT is; a URL that already ends in /v1/traces is taken as it is."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"


class Exporter:
    """Sends stored spans to one OTLP/HTTP receiver (protobuf), each call bounded by ``timeout``
    seconds, the exporter's own retries of 429/5xx and dropped connections included."""

    def __init__(self, *, endpoint: str, headers: Mapping[str, str], service_name: str, timeout: float) -> None:
        self.resource = Resource.create({"service.name": service_name})
        self._exporter = OTLPSpanExporter(endpoint=traces_url(endpoint), headers=dict(headers), timeout=timeout)

    def export(self, spans: Sequence[StoredSpan]) -> bool:
        """True when the receiver took all of them."""
        result = self._exporter.export([readable(span, resource=self.resource) for span in spans])
        return result is SpanExportResult.SUCCESS


_exporters: dict[tuple[Any, ...], Exporter] = {}


def exporter_from_settings() -> Exporter:
    """The exporter for the configured receiver, one per process (its HTTP session is reused)."""
    key = (
        settings.KOALA_OTLP_ENDPOINT,
        tuple(sorted(settings.KOALA_OTLP_HEADERS.items())),
        settings.KOALA_OTLP_SERVICE_NAME,
        float(settings.KOALA_OTLP_TIMEOUT_SECONDS),
    )
    if key not in _exporters:
        _exporters.clear()
        _exporters[key] = Exporter(endpoint=key[0], headers=dict(key[1]), service_name=key[2], timeout=key[3])
    return _exporters[key]
