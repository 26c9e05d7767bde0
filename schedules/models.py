"""Schedules: stored state, not timer events (docs/schedules.md).

A Schedule says when slots fall (cron text or an interval, in a named zone, between bounds) and
what each slot runs (a job kind with fixed input). An Occurrence is one slot of one schedule:
at most one row per (schedule, slot), written in the transaction that creates its job, so any
number of beat replicas produce exactly one run per slot. The database carries the rules.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from schedules.decide import CatchUp, Overlap


class Schedule(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=100)
    input = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=64, blank=True, default="", help_text="empty: the kind's own queue")
    cron = models.CharField(
        max_length=200, blank=True, default="", help_text="5 fields or @hourly/@daily/@weekly/@monthly/@yearly"
    )
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    zone = models.CharField(max_length=64, help_text="IANA time zone the cron text is read in")
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    # An interval's slots count from here (its start, else when it was created).
    anchor_at = models.DateTimeField()
    jitter_seconds = models.PositiveIntegerField(default=0)
    catch_up = models.CharField(max_length=16, choices=[(p.value, p.value) for p in CatchUp], default=CatchUp.SKIP)
    catch_up_window_seconds = models.PositiveIntegerField(null=True, blank=True)
    catch_up_max = models.PositiveIntegerField(null=True, blank=True)
    overlap = models.CharField(max_length=16, choices=[(p.value, p.value) for p in Overlap], default=Overlap.SKIP)
    pause_on_failures = models.PositiveIntegerField(null=True, blank=True, help_text="pause after this many failed runs in a row")
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=150, blank=True, default="")
    paused_reason = models.CharField(max_length=500, blank=True, default="")
    # Failed runs count from here on (a resume starts the count again).
    failures_since = models.DateTimeField(null=True, blank=True)
    # The stored state the materialiser reads: the newest slot decided (enqueued, buffered or
    # skipped) and the first slot after it (NULL: no slot left before ends_at).
    last_slot_at = models.DateTimeField(null=True, blank=True)
    next_slot_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        indexes = [
            # The materialiser's pick: unpaused schedules whose next slot is due.
            models.Index(fields=["next_slot_at"], name="schedule_due_idx", condition=Q(paused_at__isnull=True)),
        ]
        constraints = [
            models.CheckConstraint(
                name="schedule_cron_xor_interval",
                condition=(Q(cron="") & Q(interval_seconds__isnull=False)) | (~Q(cron="") & Q(interval_seconds__isnull=True)),
            ),
            models.CheckConstraint(
                name="schedule_interval_positive", condition=Q(interval_seconds__isnull=True) | Q(interval_seconds__gt=0)
            ),
            models.CheckConstraint(name="schedule_zone_named", condition=~Q(zone="")),
            models.CheckConstraint(
                name="schedule_ends_after_start",
                condition=Q(starts_at__isnull=True) | Q(ends_at__isnull=True) | Q(ends_at__gt=models.F("starts_at")),
            ),
            models.CheckConstraint(name="schedule_catch_up_known", condition=Q(catch_up__in=[p.value for p in CatchUp])),
            models.CheckConstraint(name="schedule_overlap_known", condition=Q(overlap__in=[p.value for p in Overlap])),
            models.CheckConstraint(
                name="schedule_all_within_bounded",
                condition=~Q(catch_up=CatchUp.ALL_WITHIN) | (Q(catch_up_window_seconds__gt=0) & Q(catch_up_max__gt=0)),
            ),
            models.CheckConstraint(
                name="schedule_pause_on_failures_positive",
                condition=Q(pause_on_failures__isnull=True) | Q(pause_on_failures__gt=0),
            ),
            models.CheckConstraint(
                name="schedule_paused_says_who_and_why",
                condition=Q(paused_at__isnull=True, paused_by="", paused_reason="")
                | (Q(paused_at__isnull=False) & ~Q(paused_by="") & ~Q(paused_reason="")),
            ),
            models.CheckConstraint(
                name="schedule_next_after_last",
                condition=Q(last_slot_at__isnull=True)
                | Q(next_slot_at__isnull=True)
                | Q(next_slot_at__gt=models.F("last_slot_at")),
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


class OccurrenceState(models.TextChoices):
    ENQUEUED = "enqueued"  # a slot's run: its job created with this row
    BUFFERED = "buffered"  # overlap buffer_one: waits for the active run to end, then enqueued
    SKIPPED = "skipped"  # not run: see reason (catch_up, overlap, refused)
    MANUAL = "manual"  # run now: a person's slot, not one of the rule's
    BACKFILL = "backfill"  # a past slot a person asked to run


class Occurrence(models.Model):
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="occurrences")
    slot_at = models.DateTimeField()
    fire_at = models.DateTimeField(help_text="the slot plus its jitter: when its job became due")
    state = models.CharField(max_length=16, choices=OccurrenceState.choices)
    reason = models.CharField(max_length=500, blank=True, default="")
    # The engine's job (no foreign key: retention prunes finished jobs without asking this app).
    job_id = models.BigIntegerField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-slot_at"]
        indexes = [models.Index(fields=["schedule", "-slot_at"], name="occurrence_latest_idx")]
        constraints = [
            # One row per slot of the rule (enqueued, buffered, skipped or backfilled) ...
            models.UniqueConstraint(fields=["schedule", "slot_at"], condition=~Q(state="manual"), name="occurrence_one_per_slot"),
            # ... and a person's manual runs, one per moment, beside them.
            models.UniqueConstraint(
                fields=["schedule", "slot_at"], condition=Q(state="manual"), name="occurrence_one_manual_per_moment"
            ),
            models.CheckConstraint(name="occurrence_state_known", condition=Q(state__in=OccurrenceState.values)),
            models.CheckConstraint(
                name="occurrence_run_has_job",
                condition=~Q(state__in=["enqueued", "manual", "backfill"]) | Q(job_id__isnull=False),
            ),
            models.CheckConstraint(
                name="occurrence_skip_has_reason_and_no_job",
                condition=~Q(state="skipped") | (~Q(reason="") & Q(job_id__isnull=True)),
            ),
            models.CheckConstraint(
                name="occurrence_buffered_has_no_job", condition=~Q(state="buffered") | Q(job_id__isnull=True)
            ),
            # At most one slot waits in the buffer.
            models.UniqueConstraint(fields=["schedule"], condition=Q(state="buffered"), name="occurrence_one_buffered"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id}@{self.slot_at.isoformat()} {self.state}"
