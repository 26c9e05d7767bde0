"""Review requests: an approval bound to the exact critical action it allows."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class ReviewState(models.TextChoices):
    PENDING = "pending"  # waiting for a reviewer
    APPROVED = "approved"  # decided yes; the job may run the action once, before expires_at
    REJECTED = "rejected"  # decided no; the job failed with review_rejected
    EXPIRED = "expired"  # nobody decided (or the approval went unused) in time
    USED = "used"  # the approved action went out (single use)
    SUPERSEDED = "superseded"  # the action changed (digest differs) before it was used


OPEN_REVIEW_STATES = (ReviewState.PENDING, ReviewState.APPROVED)


class ReviewRequest(models.Model):
    job = models.ForeignKey("workers.Job", on_delete=models.CASCADE, related_name="reviews")
    operation_name = models.CharField(max_length=100)
    operation_key = models.CharField(max_length=300)
    action = models.CharField(max_length=50, help_text="The operation kind (charge, email, …).")
    digest = models.CharField(max_length=64, help_text="sha256 of the exact action; an approval is good for this only.")
    summary = models.JSONField(default=dict, help_text="Redacted: action, parameters, amount, target, budgets, version.")
    amount_minor = models.BigIntegerField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    target = models.CharField(max_length=200, blank=True, default="")
    kind_version = models.CharField(max_length=120)
    requested_by = models.CharField(max_length=150, blank=True, default="", help_text="Who enqueued the job.")
    state = models.CharField(max_length=12, choices=ReviewState.choices, default=ReviewState.PENDING)
    expires_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=[s.value for s in ReviewState]), name="review_state_valid"),
            models.CheckConstraint(
                condition=Q(state=ReviewState.PENDING)
                | ~Q(decided_at__isnull=True)
                | Q(state=ReviewState.EXPIRED)
                | Q(state=ReviewState.SUPERSEDED),
                name="review_decided_has_time",
            ),
            # Four-eyes, in the database too: whoever enqueued the job cannot approve it
            # (withdrawing one's own request by rejecting it is allowed).
            models.CheckConstraint(
                condition=~Q(state__in=["approved", "used"]) | Q(requested_by="") | ~Q(decided_by=models.F("requested_by")),
                name="review_four_eyes",
            ),
            # At most one open review per operation: a re-run finds it instead of asking again.
            models.UniqueConstraint(
                fields=["operation_key"],
                condition=Q(state__in=[ReviewState.PENDING, ReviewState.APPROVED]),
                name="review_one_open_per_operation",
            ),
        ]
        indexes = [models.Index(fields=["created_at"], condition=Q(state=ReviewState.PENDING), name="review_pending_idx")]
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"review {self.pk}: {self.action} for job {self.job_id} ({self.state})"
