from __future__ import annotations

from django.contrib import admin

from koala.models import AuditEvent
from koala.readonly_admin import ReadOnlyAdmin


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):  # the audit log is append-only
    list_display = ["created_at", "actor", "action", "target_type", "target_id"]
    list_filter = ["action", "target_type"]
    search_fields = ["actor", "target_id"]
