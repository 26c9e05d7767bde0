"""The traces app's reads: a trace or a job's spans as a tree (the console's journal nests a
body's spans under each attempt's span). They change no row."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from traces.models import Span


@dataclass
class SpanNode:
    """One span and the spans under it, each list in the order they started."""

    span_id: str
    parent_id: str
    trace_id: str
    job_id: int
    attempt_id: int
    kind: str
    name: str
    started_at: datetime | None
    ended_at: datetime | None
    attributes: dict[str, Any]
    usage: dict[str, Any]
    error: str
    exported: bool
    children: list[SpanNode] = field(default_factory=list)

    @property
    def duration_seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    def walk(self, depth: int = 0) -> list[tuple[int, SpanNode]]:
        """This span and every one under it, depth first, with its depth (0 for this one)."""
        found = [(depth, self)]
        for child in self.children:
            found.extend(child.walk(depth + 1))
        return found


def _tree(spans: QuerySet[Span]) -> list[SpanNode]:
    nodes: list[SpanNode] = []
    by_id: dict[tuple[int, str], SpanNode] = {}
    by_span: dict[str, SpanNode] = {}
    for row in spans.order_by("started_at", "id"):
        node = SpanNode(
            span_id=row.span_id,
            parent_id=row.parent_id,
            trace_id=row.trace_id,
            job_id=row.job_id,
            attempt_id=row.attempt_id,
            kind=row.kind,
            name=row.name,
            started_at=row.started_at,
            ended_at=row.ended_at,
            attributes=dict(row.attributes or {}),
            usage=dict(row.usage or {}),
            error=row.error,
            exported=row.exported_at is not None,
        )
        nodes.append(node)
        by_id[(row.attempt_id, row.span_id)] = node
        by_span.setdefault(row.span_id, node)
    roots: list[SpanNode] = []
    for node in nodes:
        # A body span's parent is in its own attempt; an attempt's parent (a workflow's step
        # span) may be anywhere in the trace. A parent not stored here makes a root.
        parent = by_id.get((node.attempt_id, node.parent_id)) or (by_span.get(node.parent_id) if node.kind == "attempt" else None)
        if node.parent_id and parent is not None and parent is not node:
            parent.children.append(node)
        else:
            roots.append(node)
    return roots


def spans_of_trace(*, trace_id: str) -> list[SpanNode]:
    """The spans of trace ``trace_id`` as trees: the roots (attempt spans without a stored parent)
    in the order they started, each with the spans under it."""
    return _tree(Span.objects.filter(trace_id=trace_id))


def spans_of_job(*, job_id: int) -> list[SpanNode]:
    """Job ``job_id``'s spans: one root per attempt, in order, the spans its body recorded under it."""
    return _tree(Span.objects.filter(job_id=job_id))
