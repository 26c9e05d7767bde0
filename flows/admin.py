"""Workflow runs in the Django admin: read-only, redacted history. Runs are started, signalled,
cancelled and moved on the console's Runs pages (console/views/runs.py) or with ``koala_flow``,
through the audited services; the journal of a run is its console page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from flows.models import Run, RunStep, Signal
from flows.selectors import run_redactor
from koala import redaction
from koala.readonly_admin import ReadOnlyAdmin
from workers.selectors.jobs import redacted_copy


class RunDataAdmin(ReadOnlyAdmin):
    """The page of a run, or of a row about one: a redacted copy made with the run's context
    (``flows.selectors.run_redactor``), joined to the request's for the rest of the page."""

    def run_of(self, obj: Any) -> Run:
        return obj.run  # type: ignore[no-any-return]

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is None:
            return None
        redactor = run_redactor(self.run_of(obj))
        redaction.extend(redactor)
        return redacted_copy(obj, redactor)


@admin.register(Run)
class RunAdmin(RunDataAdmin):
    list_display = ["id", "definition", "version", "state", "created_by", "created_at", "finished_at", "journal"]
    list_filter = ["state", "definition"]
    search_fields = ["=id", "idempotency_key", "trace_id", "correlation_id"]
    ordering = ["-created_at", "-id"]
    readonly_fields = ["journal"]

    def run_of(self, obj: Any) -> Run:
        return obj  # type: ignore[no-any-return]

    @admin.display(description="journal")
    def journal(self, obj: Run) -> str:
        return format_html('<a href="{}">open the journal</a>', reverse("console:run", args=[obj.pk]))


@admin.register(RunStep)
class RunStepAdmin(RunDataAdmin):
    list_display = ["id", "run", "name", "state", "version", "job", "finished_at"]
    list_filter = ["state"]
    search_fields = ["=run__id", "name"]
    list_select_related = ["run"]


@admin.register(Signal)
class SignalAdmin(RunDataAdmin):
    list_display = ["id", "run", "name", "status", "consumed_by", "sent_by", "created_at"]
    list_filter = ["status"]
    search_fields = ["=run__id", "name", "key"]
    list_select_related = ["run"]
