"""Indexes that match the hot and per-page queries at a million jobs (issue 9, scenario 7).

- The console's job list orders by created_at DESC, id DESC: every list index now ends in
  exactly that order (the old ones ended in created_at alone while the list ordered by id).
- Search by trace, correlation or idempotency key is an exact match: one btree each.
- The reaper's deadline step (queued jobs past their deadline) read every queued row: it
  gets a partial index holding only queued jobs that have a deadline.
- pause_live_idx was the same index as pause_one_live_per_scope's unique index.

The new indexes are built before the old ones are dropped, so the list is never without one.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built without blocking writes: the job table is large and busy in production.
    atomic = False

    dependencies = [
        ("workers", "0008_worker_exits"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["-created_at", "-id"], name="job_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["state", "-created_at", "-id"], name="job_state_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["kind", "state", "-created_at", "-id"], name="job_kind_state_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["queue", "state", "-created_at", "-id"], name="job_queue_state_list_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state", "failed")),
                fields=["failure_reason", "-created_at", "-id"],
                name="job_failed_list_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["trace_id"], name="job_trace_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["correlation_id"], name="job_correlation_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=["idempotency_key"],
                name="job_idempotency_key_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("deadline_at__isnull", False), ("state", "queued")),
                fields=["deadline_at"],
                name="job_queued_deadline_idx",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="job_state_created_idx"),
        RemoveIndexConcurrently(model_name="job", name="job_kind_state_created_idx"),
        RemoveIndexConcurrently(model_name="job", name="job_queue_state_created_idx"),
        RemoveIndexConcurrently(model_name="pause", name="pause_live_idx"),
    ]
