"""Admin for exports: accounts and their members are reference data (editable); export
records are read-only, because requests and cancellations go through the services."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from exports.models import Account, Export, ExportState
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
    readonly_fields = ["download_link"]

    @admin.display(description="Download")
    def download_link(self, obj: Export) -> str:
        if obj.state != ExportState.SUCCEEDED:
            return "-"
        return format_html('<a href="{}">{}</a>', reverse("exports:download", args=[obj.pk]), obj.output_key)
