"""Workflow runs: a run of a versioned definition (workers.definitions), its steps and its signals.

The database carries the rules: the closed sets of states (CHECK), one row per step of a run and
one signal per (run, name, key) (UNIQUE). That terminal states never revert is the services'
conditional UPDATEs (``… WHERE state IN (live states)``), whose row count decides.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class RunState(models.TextChoices):
    RUNNING = "running"  # some step is due, queued or running
    WAITING = "waiting"  # only waits (a signal, a reviewer's approval) are pending
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


LIVE_RUN_STATES = (RunState.RUNNING, RunState.WAITING)
TERMINAL_RUN_STATES = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class StepState(models.TextChoices):
    PENDING = "pending"  # not yet due: a parent has not finished
    QUEUED = "queued"  # its job is live (queued or running)
    PARKED = "parked"  # its job is parked (a review, a budget, needs attention): the run waits
    WAITING = "waiting"  # a wait step, waiting for its signal or its timeout
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


LIVE_STEP_STATES = (StepState.PENDING, StepState.QUEUED, StepState.PARKED, StepState.WAITING)
DONE_STEP_STATES = (StepState.SUCCEEDED, StepState.FAILED, StepState.SKIPPED, StepState.CANCELLED)


class SignalStatus(models.TextChoices):
    BUFFERED = "buffered"  # accepted, no wait has consumed it yet
    CONSUMED = "consumed"  # a wait step took it (consumed_by)


class Run(models.Model):
    definition = models.CharField(max_length=60)
    version = models.PositiveIntegerField(help_text="The definition's version the run's next steps are enqueued at.")
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.RUNNING)
    input = models.JSONField(default=dict, blank=True)
    input_digest = models.CharField(max_length=64)
    run_state = models.JSONField(default=dict, blank=True, help_text="The run's state: step deltas merged by top-level key.")
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - NULL means "none"
    trace_id = models.CharField(max_length=32, blank=True, default="")
    correlation_id = models.CharField(max_length=64, blank=True, default="")
    created_by = models.CharField(max_length=150, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="", help_text="Why the run failed or was cancelled (redacted).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in RunState]), name="run_state_valid"),
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in TERMINAL_RUN_STATES], finished_at__isnull=False)
                | Q(state__in=[s.value for s in LIVE_RUN_STATES], finished_at__isnull=True),
                name="run_finished_iff_terminal",
            ),
            models.UniqueConstraint(
                fields=["definition", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key_unique_per_definition",
            ),
        ]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="run_list_idx"),
            models.Index(fields=["state", "-created_at", "-id"], name="run_state_list_idx"),
            models.Index(fields=["definition", "version"], condition=Q(state__in=["running", "waiting"]), name="run_live_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.definition}@{self.version} ({self.state})"


class RunStep(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps")
    name = models.CharField(max_length=60)
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.PENDING)
    # The job of its current attempt chain (a move to another version replaces a queued one).
    job = models.ForeignKey("workers.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    version = models.PositiveIntegerField(null=True, blank=True, help_text="The version its job was enqueued at.")
    output = models.JSONField(null=True, blank=True)
    state_after = models.JSONField(null=True, blank=True, help_text="The run's state right after this step merged its delta.")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    wait_deadline = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in StepState]), name="runstep_state_valid"),
            models.UniqueConstraint(fields=["run", "name"], name="runstep_one_per_name"),
        ]
        indexes = [
            models.Index(fields=["job"], name="runstep_job_idx"),
            models.Index(fields=["wait_deadline"], condition=Q(state="waiting"), name="runstep_wait_deadline_idx"),
        ]
        ordering = ["run_id", "id"]

    def __str__(self) -> str:
        return f"step {self.name} of run {self.run_id} ({self.state})"


class Signal(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=SignalStatus.choices, default=SignalStatus.BUFFERED)
    consumed_by = models.CharField(max_length=60, blank=True, default="", help_text="The wait step that took it.")
    sent_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=[s.value for s in SignalStatus]), name="signal_status_valid"),
            models.UniqueConstraint(fields=["run", "name", "key"], name="signal_one_per_run_name_key"),
        ]
        indexes = [models.Index(fields=["run", "name", "id"], condition=Q(status="buffered"), name="signal_buffered_idx")]
        ordering = ["run_id", "id"]

    def __str__(self) -> str:
        return f"signal {self.name}/{self.key} of run {self.run_id} ({self.status})"
