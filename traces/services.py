"""The traces app's writes: spans stored with the attempts they describe, and their export.

- ``record_attempt_spans`` (the on-transition hook, in the transition's transaction): every
  finished attempt of the jobs that moved gets its span, once (workers.sql.INSERT_ATTEMPT_SPANS).
- ``record_body_spans`` (the span sink, in the transaction that records the attempt's end): the
  spans the body recorded, redacted through the attempt's redaction context.
- ``export_spans`` (the beat task, ``export_tick``): the spans not exported yet, in batches, to the
  OTLP/HTTP receiver when ``KOALA_OTLP_ENDPOINT`` is set; each batch is marked exported only after
  the receiver took it, so a receiver that is down, answers 5xx or times out loses nothing (the
  next tick sends the batch again), and each call is bounded by ``KOALA_OTLP_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from koala import redaction
from traces import otlp
from traces import sql as traces_sql
from traces.models import Span, SpanKind
from workers import hooks, sql
from workers.hooks import AttemptSpans, Transition

log = logging.getLogger(__name__)


def record_attempt_spans(transitions: Sequence[Transition]) -> None:
    """Store the span of every finished attempt of these jobs that has none (one statement)."""
    job_ids = sorted({t.job_id for t in transitions if t.outcome is not None})
    if not job_ids:
        return  # no attempt ended (a queued job cancelled, unparked, past its deadline)
    parents = hooks.span_parents(job_ids)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.INSERT_ATTEMPT_SPANS, {"job_ids": job_ids, "parents": json.dumps({str(k): v for k, v in parents.items()})}
        )


def record_body_spans(recorded: AttemptSpans) -> None:
    """Store the spans an attempt's body recorded, under its span. Names and attributes pass the
    attempt's redaction context (bound by the runtime or the API around the report) and the
    always-sensitive keys; a parent that is not one of them (a span past the limit was dropped)
    becomes the attempt's span."""
    redactor = redaction.current()
    known = {span.span_id for span in recorded.spans} | {recorded.attempt_span_id}
    rows = []
    for span in recorded.spans:
        rows.append(
            Span(
                job_id=recorded.job_id,
                attempt_id=recorded.attempt_id,
                trace_id=recorded.trace_id,
                span_id=span.span_id,
                parent_id=span.parent_id if span.parent_id in known else recorded.attempt_span_id,
                kind=SpanKind.BODY,
                name=redactor.text(span.name, limit=200),
                started_at=span.started_at,
                ended_at=span.ended_at,
                attributes=redactor.data(dict(span.attributes)),
                usage=redactor.data(dict(span.usage)),
                error=span.error[:200],
            )
        )
    # A span id seen twice for the attempt (a repeated report's) is stored once.
    Span.objects.bulk_create(rows, ignore_conflicts=True)


@dataclass(frozen=True)
class ExportReport:
    exported: int  # spans the receiver took this run
    failed: int  # spans of batches it did not take (sent again next time)
    configured: bool


def export_spans(
    *, exporter: otlp.Exporter | None = None, batch: int | None = None, budget_seconds: float | None = None
) -> ExportReport:
    """Send the spans not exported yet, oldest first, one batch per call to the receiver, until
    none is left, a batch fails, or ``budget_seconds`` (KOALA_OTLP_TIMEOUT_SECONDS) have passed
    since the first (so a tick takes at most about two export timeouts). Nothing is sent, and
    nothing changes, when KOALA_OTLP_ENDPOINT is unset."""
    if exporter is None:
        if not settings.KOALA_OTLP_ENDPOINT:
            return ExportReport(exported=0, failed=0, configured=False)
        exporter = otlp.exporter_from_settings()
    size = int(batch or settings.KOALA_OTLP_BATCH_SPANS)
    budget = float(budget_seconds if budget_seconds is not None else settings.KOALA_OTLP_TIMEOUT_SECONDS)
    started = time.monotonic()
    exported = failed = 0
    while time.monotonic() - started < budget:
        sent, refused = _export_batch(exporter.export, size=size)
        exported += sent
        failed += refused
        if refused or sent < size:
            break
    return ExportReport(exported=exported, failed=failed, configured=True)


def _export_batch(send: Callable[[Sequence[otlp.StoredSpan]], bool], *, size: int) -> tuple[int, int]:
    """One batch: lock the oldest unexported spans, send them, mark them exported if the receiver
    took them, in one transaction (the locks keep a second exporter off them meanwhile; the
    send is bounded by the exporter's timeout). Returns (exported, failed)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(traces_sql.NEXT_UNEXPORTED, [size])
        spans = [otlp.StoredSpan.of(row) for row in cursor.fetchall()]
        if not spans:
            return 0, 0
        try:
            taken = send(spans)
        except Exception as exc:  # the exporter's own failure must not end the beat's tick
            log.warning("traces: export of %d spans failed: %s", len(spans), type(exc).__name__)
            taken = False
        if not taken:
            return 0, len(spans)
        # Marked only now: a crash before this commit sends the batch again (at least once; an
        # OTLP receiver keys spans by their ids, which are stable, so a repeat is the same span).
        cursor.execute(traces_sql.MARK_EXPORTED, [[span.id for span in spans]])
        return cursor.rowcount, 0


def export_tick() -> dict[str, Any]:
    """The beat's share (registered in TracesConfig.ready): logged as ``beat: traces exported=…``."""
    report = export_spans()
    if not report.configured:
        return {"configured": 0}
    if report.failed:
        log.warning("traces: the OTLP receiver did not take %d spans; they are sent again next tick", report.failed)
    return {"exported": report.exported, "failed": report.failed}


# -- retention (workers.hooks.register_retention) ------------------------------------------------------------------


def forget_spans(job_ids: Sequence[int]) -> int:
    """Inside a prune batch's transaction: the spans of jobs about to be deleted go with them
    (on_delete CASCADE; an unexported span past the retention window is dropped unexported)."""
    deleted, _ = Span.objects.filter(job_id__in=list(job_ids)).delete()
    return deleted
