"""Review requests in the Django admin: read-only history. Decisions are made on the review
queue (console/views/reviews.py), where four-eyes is explained and the decision goes through the
audited service."""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from koala.readonly_admin import ReadOnlyAdmin
from reviews.models import ReviewRequest


@admin.register(ReviewRequest)
class ReviewRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "action",
        "operation_name",
        "job",
        "amount_minor",
        "target",
        "state",
        "requested_by",
        "decided_by",
        "created_at",
        "decide",
    ]
    list_filter = ["state", "action"]
    search_fields = ["=id", "=job__id", "operation_key", "target", "requested_by", "decided_by"]
    list_select_related = ["job"]
    ordering = ["-created_at"]
    readonly_fields = ["decide"]

    @admin.display(description="review page")
    def decide(self, obj: ReviewRequest) -> str:
        return format_html('<a href="{}">open in the review queue</a>', reverse("reviews:detail", args=[obj.pk]))
