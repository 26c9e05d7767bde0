"""Admin for exports: accounts and their members are reference data (editable); export
records are read-only, because requests and cancellations go through the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from exports.models import Account, Export, ExportState
from exports.selectors import export_access
from koala.readonly_admin import ReadOnlyAdmin


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["members"]


@admin.register(Export)
class ExportAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "account",
        "date_from",
        "date_to",
        "state",
        "failure_code",
        "row_count",
        "bytes",
        "compute_seconds",
        "db_wait_seconds",
        "storage_wait_seconds",
        "requested_by_name",
        "created_at",
    ]
    list_filter = ["state", "failure_code", "account"]
    search_fields = ["=id", "account__slug", "requested_by_name", "checksum"]

    def get_readonly_fields(self, request: HttpRequest, obj: Export | None = None) -> list[Any]:
        # The download cell depends on who is looking, and a display method sees only the row:
        # the cell is built per request, by the rule of the download view itself.
        def download_link(export: Export) -> str:
            return download_cell(user=request.user, export=export)

        download_link.short_description = "Download"  # type: ignore[attr-defined]
        return [*super().get_readonly_fields(request, obj), download_link]


def download_cell(*, user: Any, export: Export) -> str:
    """A link for people the download view lets download this export; for everyone else, why not."""
    if export.state != ExportState.SUCCEEDED:
        return "-"
    if not export_access(user=user, exports=[export])[export.pk].may_download:
        return f"for members of {export.account.slug} and superusers"
    return format_html('<a href="{}">{}</a>', reverse("exports:download", args=[export.pk]), export.output_key)
