"""The traces app's rows: one per span, the attempt's own and the ones its body recorded."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class SpanKind(models.TextChoices):
    ATTEMPT = "attempt"  # one per job attempt: its real duration, by the database's clock
    BODY = "body"  # recorded by the body (ctx.span, a ledger operation, an HTTP worker's report)


class Span(models.Model):
    """One span of a job's trace. An attempt's span (kind ``attempt``) has the id derived from the
    attempt (workers.spans.attempt_span_id) and is unique per attempt, so no retry, reclaim or
    repeated report makes a second; a body's spans hang under it. ``usage`` is the span's own
    (tokens, cost in minor units of KOALA_COST_CURRENCY, model). ``exported_at`` is set once the
    OTLP receiver took it (traces.services.export_spans)."""

    job = models.ForeignKey("workers.Job", on_delete=models.CASCADE, related_name="trace_spans")
    attempt = models.ForeignKey("workers.Attempt", on_delete=models.CASCADE, related_name="trace_spans", db_index=False)
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    parent_id = models.CharField(max_length=16, blank=True, default="", help_text="Empty: a root of its trace.")
    kind = models.CharField(max_length=10, choices=SpanKind.choices)
    name = models.CharField(max_length=200, help_text="Redacted.")
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    attributes = models.JSONField(default=dict, blank=True, help_text="Redacted.")
    usage = models.JSONField(default=dict, blank=True)
    error = models.CharField(max_length=200, blank=True, default="", help_text="The error class that ended it; empty if none.")
    exported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["attempt", "span_id"], name="trace_span_one_id_per_attempt")]
        indexes = [
            models.Index(fields=["trace_id"], name="trace_span_trace_idx"),
            # The exporter's queue: the spans not exported yet, oldest first (small: the exported
            # ones leave it).
            models.Index(fields=["id"], condition=Q(exported_at__isnull=True), name="trace_span_unexported_idx"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"span {self.name} of job {self.job_id}"
