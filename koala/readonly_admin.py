"""The admin base for records people read but never edit there: every change goes through a
service (fenced, audited), or the record is append-only (the audit log)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:  # names and callables, as the admin takes
        # The admin links a read-only foreign key to the related object's page whoever looks
        # (an export's requester to /admin/auth/user/…, which a console role may not open: 403).
        # For a viewer that page refuses, the field shows the related object as text instead.
        unlinked = _unlinked_relations(self, request)
        return [unlinked.get(name, name) if isinstance(name, str) else name for name in super().get_fields(request, obj)]


def _unlinked_relations(model_admin: admin.ModelAdmin, request: HttpRequest) -> dict[str, Callable[[Any], str]]:
    shown: dict[str, Callable[[Any], str]] = {}
    for field in model_admin.model._meta.concrete_fields:
        if not isinstance(field, models.ForeignKey):
            continue
        target = model_admin.admin_site._registry.get(field.related_model)  # type: ignore[arg-type]
        if target is None or target.has_view_or_change_permission(request):
            continue  # no page to link to, or one this viewer may open: the admin's own link stays
        shown[field.name] = _as_text(field)
    return shown


def _as_text(field: models.ForeignKey) -> Callable[[Any], str]:
    def show(obj: Any) -> str:
        related = getattr(obj, field.name)
        return "-" if related is None else str(related)

    show.short_description = field.verbose_name  # type: ignore[attr-defined]
    return show
