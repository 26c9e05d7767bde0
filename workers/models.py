"""The engine's durable records. PostgreSQL is the truth; Redis only rings the doorbell.

The database carries the rules (CHECK constraints, partial unique indexes) so that
no code path, present or future, can write a state the engine does not know.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class JobState(models.TextChoices):
    QUEUED = "queued"  # waiting; due when scheduled_at <= now()
    RUNNING = "running"  # leased by exactly one attempt
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Delivery(models.TextChoices):
    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


class FailureReason(models.TextChoices):
    TERMINAL = "terminal"  # the body raised a typed terminal failure
    FATAL = "fatal"  # an unclassified exception: never retried blindly
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # retryable, but the budget is spent
    ORPHANED = "orphaned"  # lease expired; at_most_once cannot know if the body ran
    DEADLINE_EXCEEDED = "deadline_exceeded"  # the job's overall deadline passed


class Outcome(models.TextChoices):
    SUCCEEDED = "succeeded"
    RETRY = "retry"  # retryable error, job rescheduled with backoff
    FAILED = "failed"  # terminal or fatal (see error_class / job.failure_reason)
    ORPHANED = "orphaned"  # lease expired without a report
    UNSERVABLE = "unservable"  # the worker lacks this kind/version: no attempt used
    CANCELLED = "cancelled"  # an operator cancelled the job
    INTERRUPTED = "interrupted"  # released on shutdown or requeued by an operator


class Job(models.Model):
    kind = models.CharField(max_length=100)
    version = models.PositiveIntegerField(help_text="Contract version of the kind's input.")
    queue = models.CharField(max_length=64)
    input = models.JSONField(default=dict, help_text="Small references, never customer data or credentials.")
    input_fingerprint = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first.")
    delivery = models.CharField(max_length=16, choices=Delivery.choices, default=Delivery.AT_LEAST_ONCE)
    scheduled_at = models.DateTimeField(help_text="Not claimed before this time (delay or backoff).")
    deadline_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts used (unservable/released ones excluded).")
    max_attempts = models.PositiveIntegerField()
    timeout_seconds = models.FloatField(help_text="Per-attempt time limit.")

    # The lease. lease_token is the fencing token: every write by an attempt names it.
    lease_token = models.BigIntegerField(default=0)
    lease_holder = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    progress = models.JSONField(default=dict, blank=True, help_text="Last checkpoint stored by a heartbeat.")
    run_state = models.JSONField(default=dict, blank=True, help_text="Merged by top-level key at completion.")
    result = models.JSONField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="", help_text="Redacted; never a stack trace.")

    correlation_id = models.CharField(max_length=64, blank=True, default="")
    trace_id = models.CharField(max_length=32, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    retry_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in JobState]), name="job_state_valid"),
            models.CheckConstraint(condition=Q(delivery__in=[d.value for d in Delivery]), name="job_delivery_valid"),
            models.CheckConstraint(
                condition=Q(failure_reason__isnull=True) | Q(failure_reason__in=[r.value for r in FailureReason]),
                name="job_failure_reason_valid",
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="job_max_attempts_positive"),
            models.CheckConstraint(condition=Q(attempts__lte=models.F("max_attempts")), name="job_attempts_bounded"),
            # A running job always has a holder and an expiry; nothing else does.
            models.CheckConstraint(
                condition=(
                    Q(state=JobState.RUNNING, lease_holder__isnull=False, lease_expires_at__isnull=False)
                    | (~Q(state=JobState.RUNNING) & Q(lease_holder__isnull=True, lease_expires_at__isnull=True))
                ),
                name="job_lease_iff_running",
            ),
            models.CheckConstraint(
                condition=Q(state=JobState.FAILED, failure_reason__isnull=False)
                | (~Q(state=JobState.FAILED) & Q(failure_reason__isnull=True)),
                name="job_failed_has_reason",
            ),
            models.UniqueConstraint(
                fields=["kind", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_idempotency_key_unique_per_kind",
            ),
        ]
        indexes = [
            # Matches the claim query: WHERE state='queued' AND queue=? ORDER BY priority DESC, scheduled_at, id
            models.Index(
                "queue",
                models.F("priority").desc(),
                "scheduled_at",
                "id",
                condition=Q(state=JobState.QUEUED),
                name="job_claim_idx",
            ),
            # Matches the reaper: WHERE state='running' AND lease_expires_at < now()
            models.Index(fields=["lease_expires_at"], condition=Q(state=JobState.RUNNING), name="job_lease_expiry_idx"),
            models.Index(fields=["state", "-created_at"], name="job_state_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}@{self.version} #{self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Attempt(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField(help_text="1-based order among this job's attempts.")
    worker_id = models.CharField(max_length=200)
    lease_token = models.BigIntegerField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, null=True, blank=True)  # noqa: DJ001 - NULL means "none"; constraints test it
    error_class = models.CharField(max_length=200, blank=True, default="")
    error_message = models.TextField(blank=True, default="", help_text="Redacted; never a stack trace.")
    compute_seconds = models.FloatField(null=True, blank=True)
    db_wait_seconds = models.FloatField(null=True, blank=True)
    storage_wait_seconds = models.FloatField(null=True, blank=True)
    usage = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "lease_token"], name="attempt_one_per_lease_token"),
            # At most one live lease per job: only one unfinished attempt may exist.
            models.UniqueConstraint(fields=["job"], condition=Q(finished_at__isnull=True), name="attempt_one_live_per_job"),
            models.CheckConstraint(
                condition=Q(outcome__isnull=True) | Q(outcome__in=[o.value for o in Outcome]),
                name="attempt_outcome_valid",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True, outcome__isnull=True) | Q(finished_at__isnull=False, outcome__isnull=False),
                name="attempt_finished_iff_outcome",
            ),
        ]
        indexes = [models.Index(fields=["worker_id"], condition=Q(finished_at__isnull=True), name="attempt_live_worker_idx")]
        ordering = ["job_id", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} ({self.outcome or 'running'})"


class WorkerProcess(models.Model):
    """One RQ worker process: the base for telling a crash loop from a stuck worker."""

    name = models.CharField(max_length=200, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    kinds = models.JSONField(default=list, help_text='Served kinds as "name@version".')
    worker_class = models.CharField(max_length=100)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.name
