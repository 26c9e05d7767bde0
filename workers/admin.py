"""Admin for the engine's records: read-only, because every change must go through a
service (fenced, audited). Actions call those services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from koala.redaction import redact_data
from workers import kinds
from workers.errors import JobStateError
from workers.models import Attempt, Job, WorkerProcess
from workers.services.jobs import cancel_job, requeue_job, retry_job


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


ATTEMPT_FIELDS: tuple[str, ...] = (
    "number",
    "worker_id",
    "lease_token",
    "outcome",
    "started_at",
    "finished_at",
    "error_class",
    "error_message",
    "compute_seconds",
    "db_wait_seconds",
    "storage_wait_seconds",
)


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ATTEMPT_FIELDS
    readonly_fields = ATTEMPT_FIELDS

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _run_action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Job], verb: str, call: Any) -> None:
    done, errors = 0, []
    for job in queryset:
        try:
            call(job.pk)
            done += 1
        except JobStateError as exc:
            errors.append(str(exc))
    if done:
        modeladmin.message_user(request, f"{verb}: {done} job(s).", messages.SUCCESS)
    for error in errors[:10]:
        modeladmin.message_user(request, error, messages.WARNING)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "kind",
        "version",
        "queue",
        "state",
        "attempts",
        "max_attempts",
        "scheduled_at",
        "failure_reason",
        "created_at",
    ]
    list_filter = ["state", "queue", "kind", "failure_reason", "delivery"]
    search_fields = ["=id", "idempotency_key", "trace_id", "correlation_id"]
    ordering = ["-id"]
    inlines = [AttemptInline]
    actions = ["cancel_jobs", "retry_jobs", "requeue_jobs"]
    exclude = ["input", "run_state", "result"]
    readonly_fields = ["redacted_input", "redacted_run_state", "redacted_result"]

    def _sensitive(self, obj: Job) -> frozenset[str]:
        kind = kinds.get(obj.kind, obj.version)
        return kind.sensitive_fields if kind else frozenset()

    @admin.display(description="input (redacted)")
    def redacted_input(self, obj: Job) -> Any:
        return redact_data(obj.input, sensitive=self._sensitive(obj))

    @admin.display(description="run state (redacted)")
    def redacted_run_state(self, obj: Job) -> Any:
        return redact_data(obj.run_state, sensitive=self._sensitive(obj))

    @admin.display(description="result (redacted)")
    def redacted_result(self, obj: Job) -> Any:
        return redact_data(obj.result, sensitive=self._sensitive(obj))

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Cancelled", lambda pk: cancel_job(job_id=pk, actor=actor, reason="admin action"))

    @admin.action(description="Retry selected failed/cancelled jobs (as new jobs)")
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Retried", lambda pk: retry_job(job_id=pk, actor=actor))

    @admin.action(description="Requeue selected jobs now")
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Requeued", lambda pk: requeue_job(job_id=pk, actor=actor))


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "number", "worker_id", "outcome", "started_at", "finished_at", "error_class"]
    list_filter = ["outcome"]
    search_fields = ["=job__id", "worker_id"]


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    list_display = ["name", "hostname", "pid", "worker_class", "started_at", "last_seen_at", "stopped_at"]
    list_filter = ["hostname", "worker_class"]
