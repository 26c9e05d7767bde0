"""Admin for the engine's records: read-only, because every change must go through a
service (fenced, audited). Actions call those services."""

from __future__ import annotations

import zoneinfo
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from koala import redaction
from koala.readonly_admin import ReadOnlyAdmin
from workers import kinds, targets
from workers.errors import JobStateError, SafetyError
from workers.models import (
    Attempt,
    BeatTask,
    Budget,
    BudgetUsage,
    Job,
    ModelPrice,
    Operation,
    Pause,
    Span,
    TickLease,
    WorkerProcess,
)
from workers.selectors.jobs import job_for_person, redacted_copy
from workers.services import budgets as budget_services
from workers.services.jobs import cancel_job, requeue_job, retry_job

ATTEMPT_FIELDS: tuple[str, ...] = (
    "number",
    "worker_id",
    "lease_token",
    "outcome",
    "started_at",
    "finished_at",
    "error_class",
    "redacted_error_message",
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

    @admin.display(description="error message (redacted)")
    def redacted_error_message(self, obj: Attempt) -> str:
        # Masked again with the job's context, which the job page joined to the request's.
        return redaction.redact_text(obj.error_message, limit=2_000)


class JobDataAdmin(ReadOnlyAdmin):
    """The page of a job, or of a row about one: it shows a redacted copy of the row (all fields,
    checkpoint and usage included) made with the job's redaction context
    (``workers.kinds.job_redactor``), which also joins the request's for the rest of the page."""

    def job_of(self, obj: Any) -> Job:
        return obj.job  # type: ignore[no-any-return]

    def shown(self, request: HttpRequest, obj: Any) -> Any:
        redactor = kinds.job_redactor(self.job_of(obj))
        redaction.extend(redactor)
        return redacted_copy(obj, redactor)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        return None if obj is None else self.shown(request, obj)


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
class JobAdmin(JobDataAdmin):
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

    def shown(self, request: HttpRequest, obj: Job) -> Job:
        # The job as a person sees it: the engine's one view of a job (workers.selectors.jobs),
        # which also writes the read's audit row (R19), here as on the console's job page.
        view = job_for_person(job_id=obj.pk, actor=request.user.get_username())
        redaction.extend(view.redactor)
        return view.job

    # get_object() hands the page a redacted copy: these only label the fields as such.
    @admin.display(description="input (redacted)")
    def redacted_input(self, obj: Job) -> Any:
        return obj.input

    @admin.display(description="run state (redacted)")
    def redacted_run_state(self, obj: Job) -> Any:
        return obj.run_state

    @admin.display(description="result (redacted)")
    def redacted_result(self, obj: Job) -> Any:
        return obj.result

    def has_operate_permission(self, request: HttpRequest) -> bool:
        # Changing jobs is the operators' role (console.roles); viewing alone must not offer it.
        return bool(request.user.has_perm("console.operate"))

    @admin.action(description="Cancel selected jobs", permissions=["operate"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Cancelled", lambda pk: cancel_job(job_id=pk, actor=actor, reason="admin action"))

    @admin.action(description="Retry selected failed/cancelled jobs (as new jobs)", permissions=["operate"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Retried", lambda pk: retry_job(job_id=pk, actor=actor))

    @admin.action(description="Requeue selected jobs now", permissions=["operate"])
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        actor = request.user.get_username()
        _run_action(self, request, queryset, "Requeued", lambda pk: requeue_job(job_id=pk, actor=actor))


@admin.register(Attempt)
class AttemptAdmin(JobDataAdmin):
    list_display = ["id", "job", "number", "worker_id", "outcome", "started_at", "finished_at", "error_class"]
    list_filter = ["outcome"]
    search_fields = ["=job__id", "worker_id"]


@admin.register(Span)
class SpanAdmin(JobDataAdmin):
    """Legacy, read-only: an attempt's trace as stored before the traces app (the step span Koala
    opened and the spans an HTTP worker's body sent). Nothing writes workers_span any more: spans
    are rows of traces_span, shown in each run's journal. Its pages say so in their titles (the
    model's verbose_name stays: changing it would take a migration for a table a later contract
    migration drops)."""

    list_display = ["id", "job", "attempt", "span_name", "span_id", "parent_id", "started_at", "ended_at"]
    list_select_related = ["job", "attempt"]
    search_fields = ["=job__id", "=trace_id", "=span_id"]
    LEGACY = "Legacy spans (before the traces app; no longer written: spans are rows of traces_span)"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        return super().changelist_view(request, {"title": self.LEGACY, **(extra_context or {})})

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> Any:
        title = "Legacy span (no longer written: spans are rows of traces_span)"
        return super().change_view(request, object_id, form_url, {"title": title, **(extra_context or {})})

    @admin.display(description="name")
    def span_name(self, obj: Span) -> str:
        # The list shows rows, not shown() copies: mask the name with its job's context here.
        return kinds.job_redactor(obj.job).text(obj.name)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    list_display = ["name", "hostname", "pid", "worker_class", "concurrency", "started_at", "last_seen_at", "stopped_at"]
    list_filter = ["hostname", "worker_class"]


@admin.register(BeatTask)
class BeatTaskAdmin(ReadOnlyAdmin):
    """Each beat step's last tick (written by koala_beat; `koala_beat --status` reads the same rows)."""

    list_display = ["name", "last_succeeded_at", "last_failed_at", "last_error", "consecutive_failures", "failures", "beat"]


@admin.register(TickLease)
class TickLeaseAdmin(ReadOnlyAdmin):
    """Each timer-started task's lease and last outcome (koala_tick). The token is the holder's
    fence, of no use to a reader: left off the page."""

    list_display = ["name", "owner", "acquired_at", "expires_at", "released_at", "last_outcome"]
    exclude = ["token"]


@admin.register(Operation)
class OperationAdmin(JobDataAdmin):
    list_display = ["id", "job", "name", "kind", "state", "resolution", "external_id", "amount", "cost_minor", "updated_at"]
    list_filter = ["state", "kind", "resolution"]
    search_fields = ["key", "external_id"]
    list_select_related = ["job"]

    @admin.display(description="amount")
    def amount(self, obj: Operation) -> str:
        """The amount in its own currency (the operation's, never a key of its parameters)."""
        return "—" if obj.amount_minor is None else f"{obj.amount_minor / 100:,.2f} {obj.currency}".strip()


@admin.register(BudgetUsage)
class BudgetUsageAdmin(ReadOnlyAdmin):
    list_display = ["budget", "period", "spent_minor", "reserved_minor", "requests", "attempts", "run_seconds"]
    list_filter = ["budget"]
    list_select_related = ["budget"]


@admin.register(Pause)
class PauseAdmin(ReadOnlyAdmin):
    list_display = ["id", "scope", "target", "tenant", "mode", "source", "created_by", "created_at", "expires_at", "lifted_at"]
    list_filter = ["scope", "mode", "source"]


class AuditedServiceAdmin(admin.ModelAdmin):
    """Editable, but every save goes through the service that validates and audits it."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class BudgetForm(forms.ModelForm):
    class Meta:
        model = Budget
        fields = ["name", "scope", "target", "tenant", "timezone", *budget_services.LIMIT_FIELDS, "pause_on_exhaust"]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.instance.pk is None and "scope" in cleaned:
            # The budget service's own rule (a configured queue, a known kind), said on the form.
            try:
                targets.check_scope(cleaned["scope"], cleaned.get("target") or "")
            except SafetyError as exc:
                self.add_error("target", str(exc))
        return cleaned

    def clean_timezone(self) -> str:
        value = self.cleaned_data["timezone"]
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise forms.ValidationError(f"unknown time zone {value!r} (use an IANA name such as Europe/Paris).") from None
        return value


@admin.register(Budget)
class BudgetAdmin(AuditedServiceAdmin):
    form = BudgetForm
    list_display = ["name", "scope", "target", "tenant", "timezone", *budget_services.LIMIT_FIELDS, "pause_on_exhaust"]
    fields = ["name", "scope", "target", "tenant", "timezone", "currency", *budget_services.LIMIT_FIELDS, "pause_on_exhaust"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Scope and period are identity: change them by creating another budget. The currency is
        # the cost currency, shown, never chosen (Budget.currency).
        return ["name", "scope", "target", "tenant", "timezone", "currency"] if obj is not None else ["currency"]

    def save_model(self, request: HttpRequest, obj: Budget, form: Any, change: bool) -> None:
        actor = request.user.get_username()
        limits = {f: getattr(obj, f) for f in budget_services.LIMIT_FIELDS}
        if change:
            budget_services.update_budget(budget_id=obj.pk, actor=actor, pause_on_exhaust=obj.pause_on_exhaust, **limits)
        else:
            created = budget_services.create_budget(
                name=obj.name,
                scope=obj.scope,
                target=obj.target,
                tenant=obj.tenant,
                timezone=obj.timezone,
                pause_on_exhaust=obj.pause_on_exhaust,
                actor=actor,
                **limits,
            )
            obj.pk = created.pk


@admin.register(ModelPrice)
class ModelPriceAdmin(AuditedServiceAdmin):
    list_display = ["model", "input_minor_per_mtok", "output_minor_per_mtok", "updated_by", "updated_at"]
    fields = ["model", "input_minor_per_mtok", "output_minor_per_mtok"]

    def save_model(self, request: HttpRequest, obj: ModelPrice, form: Any, change: bool) -> None:
        saved = budget_services.set_model_price(
            model=obj.model,
            input_minor_per_mtok=obj.input_minor_per_mtok,
            output_minor_per_mtok=obj.output_minor_per_mtok,
            actor=request.user.get_username(),
        )
        obj.pk = saved.pk
