"""The tallies behind the counters: what has been folded out of the engine's rows, so a counter
never goes down when a process restarts or retention deletes the rows it was counted from.

A counter's value at a scrape is its tally plus the engine's rows finished at or after the fold
mark's ``folded_before`` (metrics.selectors): exact at scrape time, not lagging by a fold. The
fold (metrics.services.fold, a beat task) moves the mark forward and adds what it passed; the
retention hook adds a pruned job's rows that were not folded yet, in the prune's transaction.
"""

from __future__ import annotations

from django.db import models


class FoldMark(models.Model):
    """Where the fold stands: every attempt and job finished before ``folded_before`` is in the
    tallies, none at or after it. One row (name "engine"); its row lock serializes folds."""

    name = models.CharField(max_length=30, primary_key=True)
    folded_before = models.DateTimeField()
    folded_at = models.DateTimeField(help_text="When the last fold ran.")

    def __str__(self) -> str:
        return f"fold mark {self.name}: before {self.folded_before:%Y-%m-%d %H:%M:%S}"


class CompletionTally(models.Model):
    """Attempts that ended, by queue, kind and outcome (koala_job_completions_total)."""

    queue = models.CharField(max_length=64)
    kind = models.CharField(max_length=100)
    outcome = models.CharField(max_length=16)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "kind", "outcome"], name="completion_tally_key")]

    def __str__(self) -> str:
        return f"{self.queue} {self.kind} {self.outcome}: {self.count}"


class FailureTally(models.Model):
    """Jobs that ended failed, by queue, kind and failure reason (koala_job_failures_total)."""

    queue = models.CharField(max_length=64)
    kind = models.CharField(max_length=100)
    reason = models.CharField(max_length=32)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "kind", "reason"], name="failure_tally_key")]

    def __str__(self) -> str:
        return f"{self.queue} {self.kind} {self.reason}: {self.count}"


class DurationTally(models.Model):
    """Attempt durations by kind, part and bucket (koala_attempt_duration_seconds): ``bucket`` is
    the index of the first bound at or above the value (len(bounds) for +Inf), not cumulative;
    ``total`` is the sum of the values in it."""

    kind = models.CharField(max_length=100)
    part = models.CharField(max_length=16)
    bucket = models.SmallIntegerField()
    count = models.BigIntegerField(default=0)
    total = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "part", "bucket"], name="duration_tally_key")]

    def __str__(self) -> str:
        return f"{self.kind} {self.part} bucket {self.bucket}: {self.count}"


class KeptJobTally(models.Model):
    """Finished jobs still kept, by queue and terminal state (koala_jobs for those states): added
    when the fold passes a job's finished_at, taken off when retention deletes it. Counting them
    at each scrape would read every kept row (1M at a time)."""

    queue = models.CharField(max_length=64)
    state = models.CharField(max_length=16)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["queue", "state"], name="kept_job_tally_key")]

    def __str__(self) -> str:
        return f"{self.queue} {self.state}: {self.count}"


class RejectionEvent(models.Model):
    """Named refusals not folded yet: appended by the rejection counter (insert only, so two
    processes never wait on one row), summed into RejectionTally by the fold."""

    reason = models.CharField(max_length=48)
    count = models.PositiveIntegerField(default=1)
    at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.reason} x{self.count}"


class RejectionTally(models.Model):
    """Named refusals by reason (koala_rejections_total)."""

    reason = models.CharField(max_length=48, primary_key=True)
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.reason}: {self.count}"
