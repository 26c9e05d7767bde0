"""Indexes that keep every dashboard statement a bounded index range at a million jobs.

- job_queued_due_idx (queue, scheduled_at, id) WHERE state = 'queued' (and scheduled_at IS
  NOT NULL, so only statements bounding scheduled_at can use it; the dispatcher's walk and the
  claim keep job_claim_idx): the oldest due job of a queue is its first entry at or before
  now, and the capped due count is a range of one queue.
- job_finished_cover_idx replaces job_finished_idx with (state, queue) included, so the
  24 h completions per queue and the hourly charts are index-only reads of the window.

The new index is built before the old one is dropped.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built without blocking writes: the job table is large and busy in production.
    atomic = False

    dependencies = [
        ("workers", "0009_scale_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("scheduled_at__isnull", False), ("state", "queued")),
                fields=["queue", "scheduled_at", "id"],
                name="job_queued_due_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                include=["state", "queue"],
                name="job_finished_cover_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="job_finished_idx"),
    ]
