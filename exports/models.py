"""Exports: the data an internal report reads (accounts and their events) and the export record.

An Export is one logical result. Every attempt of its job works for that one row, and the
output key is derived from its id, so retries and reclaims converge on one object.
The database carries the rules (CHECK constraints) so no code path can store a succeeded
export without its checksum, or a failed one without its reason.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Account(models.Model):
    """A customer account: the unit of authorization for exports."""

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    # Who may request and download this account's exports (superusers may always).
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="export_accounts", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Event(models.Model):
    """One account event (login, purchase, refund, …): the rows an export streams.

    Loaded in bulk with COPY by ``koala_demo_data``; nothing in Koala writes it row by row.
    """

    id = models.BigAutoField(primary_key=True)
    # No separate index on account: the composite index below starts with it.
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="+", db_index=False)
    occurred_at = models.DateTimeField()
    event_type = models.CharField(max_length=32)
    user_ref = models.CharField(max_length=32)
    amount_minor = models.BigIntegerField(default=0)
    currency = models.CharField(max_length=3)
    country = models.CharField(max_length=2)
    detail = models.TextField(blank=True, default="")

    class Meta:
        indexes = [
            # The export query: one account, a time range, in (occurred_at, id) order; it is
            # also the keyset, so a batch boundary is one index position.
            models.Index(fields=["account", "occurred_at", "id"], name="event_account_time_idx"),
        ]

    def __str__(self) -> str:
        return f"event {self.pk} of account {self.account_id}"


class ExportFormat(models.TextChoices):
    CSV = "csv", "CSV (RFC 4180, header row, UTF-8)"


class ExportState(models.TextChoices):
    QUEUED = "queued"  # requested; its job waits for a worker on the exports queue
    RUNNING = "running"  # an attempt is streaming or publishing
    SUCCEEDED = "succeeded"  # published: output_key holds checksum/bytes/row_count
    FAILED = "failed"  # failure_code says why (terminal reasons, attempts exhausted, …)
    CANCELLED = "cancelled"


EXPORT_TERMINAL_STATES = (ExportState.SUCCEEDED, ExportState.FAILED, ExportState.CANCELLED)


class Export(models.Model):
    # The authorized scope: one account and a date range (inclusive, UTC calendar days).
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="exports")
    date_from = models.DateField()
    date_to = models.DateField()
    format = models.CharField(max_length=16, default=ExportFormat.CSV)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="exports"
    )
    # Kept when the user row goes away: the audit trail names a person, not a NULL.
    requested_by_name = models.CharField(max_length=150)

    # Limits, fixed at request time (bounded by the KOALA_EXPORT_MAX_* caps).
    max_rows = models.BigIntegerField()
    max_bytes = models.BigIntegerField()
    time_limit_seconds = models.FloatField(help_text="Per attempt, checked between batches.")

    state = models.CharField(max_length=16, choices=ExportState.choices, default=ExportState.QUEUED)
    job = models.OneToOneField("workers.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="export")
    failure_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.TextField(blank=True, default="", help_text="Redacted; never customer data or a stack trace.")

    # The result. output_key is derived from the id (exports.storage.output_key_for).
    output_key = models.CharField(max_length=300, blank=True, default="")
    checksum = models.CharField(max_length=64, blank=True, default="", help_text="sha256 of the published object")
    bytes = models.BigIntegerField(null=True, blank=True)
    row_count = models.BigIntegerField(null=True, blank=True)
    # A complete, synced temporary object waiting to be published (named before the publish
    # operation is recorded, so a replacement attempt can finish an interrupted publish).
    staged_key = models.CharField(max_length=300, blank=True, default="")
    staged_checksum = models.CharField(max_length=64, blank=True, default="")
    staged_bytes = models.BigIntegerField(null=True, blank=True)
    staged_rows = models.BigIntegerField(null=True, blank=True)

    # Timing split of the attempt that produced the result (each attempt row has its own).
    compute_seconds = models.FloatField(null=True, blank=True)
    db_wait_seconds = models.FloatField(null=True, blank=True)
    storage_wait_seconds = models.FloatField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts that started streaming.")

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in ExportState]), name="export_state_valid"),
            models.CheckConstraint(condition=Q(date_to__gte=models.F("date_from")), name="export_date_range_ordered"),
            models.CheckConstraint(
                condition=Q(max_rows__gt=0, max_bytes__gt=0, time_limit_seconds__gt=0), name="export_limits_positive"
            ),
            # A published export always carries what a download verifies against.
            models.CheckConstraint(
                condition=~Q(state=ExportState.SUCCEEDED)
                | (
                    Q(bytes__isnull=False, row_count__isnull=False, finished_at__isnull=False)
                    & ~Q(output_key="")
                    & ~Q(checksum="")
                ),
                name="export_succeeded_has_result",
            ),
            models.CheckConstraint(condition=~Q(state=ExportState.FAILED) | ~Q(failure_code=""), name="export_failed_has_reason"),
        ]
        indexes = [models.Index(fields=["account", "-created_at"], name="export_account_created_idx")]

    def __str__(self) -> str:
        return f"export {self.pk} of {self.account_id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in EXPORT_TERMINAL_STATES
