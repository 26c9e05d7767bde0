"""Schedules in the Django admin: the rule explained in words, the next fires, the occurrences.

Edits go through the services (create_schedule / update_schedule), so the admin validates and
audits exactly as the console and koala_schedule do."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html_join

from schedules import selectors, services
from schedules.errors import ScheduleError
from schedules.models import Occurrence, Schedule

_EDITABLE = list(services.FIELDS)


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ["name", *_EDITABLE]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        values = {name: data.get(name) for name in _EDITABLE}
        values["input"] = values["input"] if values["input"] is not None else {}
        try:
            services.validated(values)
        except ScheduleError as exc:
            raise ValidationError(str(exc)) from None
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "kind", "rule_in_words", "catch_up", "overlap", "next_slot_at", "paused_at")
    search_fields = ("name", "kind")
    readonly_fields = (
        "rule_in_words",
        "next_fires",
        "last_slot_at",
        "next_slot_at",
        "paused_at",
        "paused_by",
        "paused_reason",
        "created_by",
    )

    @admin.display(description="rule")
    def rule_in_words(self, obj: Schedule) -> str:
        # The stored row's: a refused form leaves its unsaved values on the instance it shows.
        return selectors.explanation(selectors.get_schedule(schedule_id=obj.pk)) if obj.pk else ""

    @admin.display(description="next fires (zone | UTC)")
    def next_fires(self, obj: Schedule) -> str:
        if not obj.pk:
            return ""
        fires = selectors.next_fires(selectors.get_schedule(schedule_id=obj.pk), now=timezone.now())
        return format_html_join("", "<div>{} | {}</div>", ((f.fire_local.isoformat(), f.fire_utc.isoformat()) for f in fires))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # A schedule keeps its name (its jobs' keys and the audit rows name it by id, people by name).
        return (*self.readonly_fields, "name") if obj is not None else self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        values = {name: form.cleaned_data.get(name) for name in _EDITABLE}
        values["input"] = values["input"] if values["input"] is not None else {}
        who = request.user.get_username()
        if change:
            saved = services.update_schedule(schedule_id=obj.pk, actor=who, **values)
        else:
            saved = services.create_schedule(name=form.cleaned_data["name"], actor=who, **values)
        obj.pk = saved.pk
        obj.refresh_from_db()


@admin.register(Occurrence)
class OccurrenceAdmin(admin.ModelAdmin):
    list_display = ("schedule", "slot_at", "fire_at", "state", "reason", "job_id", "created_by")
    list_filter = ("state",)
    readonly_fields = [f.name for f in Occurrence._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
