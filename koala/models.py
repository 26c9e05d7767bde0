from __future__ import annotations

from django.db import models


class AuditAction(models.TextChoices):
    """Every action an audit row can record (zulip's AuditLogEventType is the model).

    The values are the ones rows carried before this enum existed, so stored rows, docs and
    saved searches keep their meaning: the engine's own actions read bare ("cancel"), the apps'
    carry their area ("export.download"). Each label leads with its value, so the audit log's
    pages show the name that queries and docs use. Add a member here for a new action;
    ``record_audit`` refuses anything else.
    """

    # People reading run data (R19): the target says what (job, job_list, failures, operations, export_list).
    READ = "read", "read: a person read run data"
    # The engine's jobs (workers.services.jobs; the console's bulk actions add one summary row each).
    ENQUEUE = "enqueue", "enqueue: jobs enqueued by a person"
    CANCEL = "cancel", "cancel: cancel a job"
    RETRY = "retry", "retry: retry a job as a new one"
    REQUEUE = "requeue", "requeue: requeue a job"
    BULK_CANCEL = "bulk_cancel", "bulk_cancel: cancel selected jobs"
    BULK_RETRY = "bulk_retry", "bulk_retry: retry selected jobs"
    BULK_REQUEUE = "bulk_requeue", "bulk_requeue: requeue selected jobs"
    # The safety layer (workers.services.pauses, budgets, operations).
    PAUSE = "pause", "pause: pause a scope"
    RESUME = "resume", "resume: lift a pause"
    BUDGET_CREATE = "budget.create", "budget.create: create a budget"
    BUDGET_UPDATE = "budget.update", "budget.update: change a budget's limits"
    PRICE_SET = "price.set", "price.set: set a model price"
    OPERATION_RESOLVE = "operation.resolve", "operation.resolve: settle an uncertain operation"
    # Reviews (reviews.services).
    REVIEW_REQUESTED = "review.requested", "review.requested: an approval asked for"
    REVIEW_SUPERSEDED = "review.superseded", "review.superseded: superseded by a changed action"
    REVIEW_APPROVE = "review.approve", "review.approve: approve a review"
    REVIEW_REJECT = "review.reject", "review.reject: reject a review"
    REVIEW_EXPIRED = "review.expired", "review.expired: expired undecided"
    REVIEW_WITHDRAWN = "review.withdrawn", "review.withdrawn: withdrawn with its cancelled job"
    # Exports (exports.services).
    EXPORT_REQUEST = "export.request", "export.request: request an export"
    EXPORT_CANCEL = "export.cancel", "export.cancel: cancel an export"
    EXPORT_DOWNLOAD = "export.download", "export.download: download an export"
    EXPORT_GRANT_ACCESS = "export.grant_access", "export.grant_access: grant access to an account's exports"
    # API keys (api.keys). A person's key reading run data writes READ rows like any person.
    API_KEY_CREATED = "api_key.create", "api_key.create: create an API key"
    API_KEY_REVOKED = "api_key.revoke", "api_key.revoke: revoke an API key"
    # Workflow runs (flows.services).
    RUN_START = "run.start", "run.start: start a workflow run"
    RUN_SIGNAL = "run.signal", "run.signal: send a signal to a run"
    RUN_CANCEL = "run.cancel", "run.cancel: cancel a workflow run"
    RUN_MOVE = "run.move", "run.move: move a run to another version of its definition"
    # Schedules (schedules.services). A pause by the schedule itself (pause_on_failures) has actor "schedule".
    SCHEDULE_CREATE = "schedule.create", "schedule.create: create a schedule"
    SCHEDULE_UPDATE = "schedule.update", "schedule.update: change a schedule"
    SCHEDULE_PAUSE = "schedule.pause", "schedule.pause: pause a schedule"
    SCHEDULE_RESUME = "schedule.resume", "schedule.resume: resume a schedule"
    SCHEDULE_RUN_NOW = "schedule.run_now", "schedule.run_now: run a schedule's kind now (a manual slot)"
    SCHEDULE_BACKFILL = "schedule.backfill", "schedule.backfill: run a schedule's past slots"


class AuditEvent(models.Model):
    """Who did what: operator actions and people reading run data, never the worker's machine loop.

    Written by services in the same transaction as the change it records (koala.audit.record_audit).
    """

    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64, choices=AuditAction.choices)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    details = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.target_type}:{self.target_id}"
