"""The review gate: approvals bound to the exact critical action, decided by a second person.

- Only a reviewer decides: an active user holding ``REVIEW_PERMISSION`` (``reviewer_refusal``),
  asked by approve_review and reject_review whichever path calls them.
- A job body that reaches a critical operation without a usable approval creates a
  ReviewRequest (bound to the action's digest) and is parked ``waiting_review``.
- Approving or rejecting is one conditional UPDATE (``state = 'pending'`` and not expired
  and not the requester): its row count decides, and the audit row is written in the
  same transaction.
- An approval is used once: the UPDATE that marks it ``used`` runs in the transaction
  that records the operation as in flight. A re-send of that same operation (same key,
  same digest, e.g. after a 429) is the same action and stays covered; anything else
  needs a new approval.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from reviews import sql as reviews_sql
from reviews.models import OPEN_REVIEW_STATES, ReviewRequest, ReviewState
from workers import sql
from workers.errors import SafetyError
from workers.models import FailureReason, Job, JobState, ParkReason
from workers.services.jobs import fail_parked, unpark_jobs

# Who may decide a review: the permission the console's reviewers group holds (its migration,
# console/migrations/0001_roles.py; console.roles.REVIEW is this constant). A dotted string: the
# console sits above this app and is never imported from here.
REVIEW_PERMISSION = "console.review"
WHO_DECIDES = (
    "only an active user holding the review permission (the reviewers group; superusers hold every permission) "
    "may approve or reject a review"
)


class NotAReviewer(SafetyError):
    """The decider is not an active user holding the review permission (reviewer_refusal)."""


def reviewer_refusal(*, actor: str) -> str | None:
    """Why ``actor`` (a user name) may not decide reviews at all (None: they may). Every path
    that decides (the command, the console, any later one) goes through approve_review and
    reject_review, which ask this first; the console shows it on its disabled buttons."""
    user_model = get_user_model()
    user = user_model.objects.filter(**{user_model.USERNAME_FIELD: actor}).first()
    if user is None:
        return f"no user named {actor!r}: {WHO_DECIDES}."
    if not user.is_active:
        return f"user {actor!r} is inactive: {WHO_DECIDES}."
    if not user.has_perm(REVIEW_PERMISSION):
        return f"{actor!r} is not a reviewer: {WHO_DECIDES}."
    return None


def action_digest(binding: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of what an approval is for."""
    canonical = json.dumps(binding, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def pending_reviews() -> QuerySet[ReviewRequest]:
    """Oldest first: the order a reviewer should work in."""
    return ReviewRequest.objects.filter(state=ReviewState.PENDING).select_related("job").order_by("created_at")


def decision_blocker(*, review: ReviewRequest, actor: str, approving: bool = True) -> str | None:
    """Why ``actor`` may not decide this review now (None: they may). The UI shows this text."""
    if refusal := reviewer_refusal(actor=actor):
        return refusal
    if review.state != ReviewState.PENDING:
        who = f" by {review.decided_by}" if review.decided_by else ""
        return f"this review is already {review.state}{who}."
    if review.expires_at <= timezone.now():
        return "this review has expired; the job ends by policy."
    job_state, park_reason = Job.objects.filter(pk=review.job_id).values_list("state", "park_reason").first() or ("", None)
    if job_state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        return f"the job is already {job_state}; there is nothing left to decide."
    if (job_state, park_reason) != (JobState.PARKED, ParkReason.WAITING_REVIEW):
        return (
            f"the job is {job_state} right now; decide once it is parked waiting for this review "
            "(it parks when it reaches the action)."
        )
    if approving and review.requested_by and review.requested_by == actor:
        return "four-eyes rule: you requested this action (you enqueued the job), so someone else must approve it."
    return None


# -- the gate (called from a job body via ctx.operation, inside its transaction) ----------------


def consume_approval(*, job_id: int, operation_key: str, digest: str) -> bool:
    """Use an approval for exactly this action, if one is usable. Caller holds the transaction."""
    with connection.cursor() as cursor:
        cursor.execute(reviews_sql.USE_APPROVAL, [job_id, operation_key, digest])
        if cursor.fetchone():
            return True
        # Already used for this very action: a re-send under the same key is the same action.
        cursor.execute(reviews_sql.APPROVAL_USED, [job_id, operation_key, digest])
        return cursor.fetchone() is not None


def request_review(
    *,
    job_id: int,
    operation_name: str,
    operation_key: str,
    action: str,
    digest: str,
    summary: dict[str, Any],
    amount_minor: int | None,
    currency: str,
    target: str,
    kind_version: str,
    requested_by: str,
) -> ReviewRequest:
    """Ask for an approval of exactly this action (or find the pending one already asking)."""
    with transaction.atomic():
        open_reviews = list(
            ReviewRequest.objects.select_for_update().filter(
                operation_key=operation_key, state__in=[ReviewState.PENDING, ReviewState.APPROVED]
            )
        )
        for review in open_reviews:
            if review.digest == digest and review.state == ReviewState.PENDING:
                return review
            # The action changed since this was asked (or approved): that decision is not for this action.
            review.state = ReviewState.SUPERSEDED
            review.save(update_fields=["state"])
            record_audit(
                actor="koala",
                action=AuditAction.REVIEW_SUPERSEDED,
                target_type="review",
                target_id=review.pk,
                details={"job": job_id, "old_digest": review.digest, "new_digest": digest},
            )
        review = ReviewRequest.objects.create(
            job_id=job_id,
            operation_name=operation_name,
            operation_key=operation_key,
            action=action,
            digest=digest,
            summary=summary,
            amount_minor=amount_minor,
            currency=currency,
            target=target,
            kind_version=kind_version,
            requested_by=requested_by,
            expires_at=timezone.now() + timedelta(seconds=float(settings.KOALA_REVIEW_TTL_SECONDS)),
        )
        record_audit(
            actor="koala",
            action=AuditAction.REVIEW_REQUESTED,
            target_type="review",
            target_id=review.pk,
            details={"job": job_id, "action": action, "digest": digest, "amount_minor": amount_minor, "target": target},
        )
    return review


# -- decisions (people) --------------------------------------------------------------------------


def _get(review_id: int) -> ReviewRequest:
    review = ReviewRequest.objects.filter(pk=review_id).first()
    if review is None:
        raise SafetyError(f"review {review_id} does not exist.")
    return review


def _check_decider(*, review_id: int, actor: str) -> None:
    """Refuse, before anything is written, a review that does not exist or a decider who is not
    an active reviewer (not audited: no refusal is, and a refused call changes nothing). Checked
    outside the decision's transaction: a permission has no row to lock, and a reviewer removed
    from the group while deciding is as if removed a moment later."""
    _get(review_id)
    if refusal := reviewer_refusal(actor=actor):
        raise NotAReviewer(refusal)


def _lock_job_of(review_id: int) -> None:
    """Lock the review's job row, first. Lock order: job, then review, as cancel_job (which
    withdraws the job's reviews) and the expiry do; deciding the review first and touching the
    job after would deadlock against a concurrent cancel. Holding the job also keeps the state
    the decision's UPDATE tests (parked waiting for review) true until we commit."""
    with connection.cursor() as cursor:
        cursor.execute(sql.LOCK_JOB_OF_REVIEW, [review_id])


def approve_review(*, review_id: int, actor: str, comment: str = "") -> ReviewRequest:
    """Approve a pending review (not one's own) of a job parked for it; the job is queued and re-runs.

    A job not parked for review (queued or running again after an operator's requeue) is
    refused: its attempt is about to park on this review or has just found it, and an
    approval whose unpark found the job still running would leave it parked for ever.
    """
    if not actor:
        raise SafetyError("an approval needs the approver's name.")
    _check_decider(review_id=review_id, actor=actor)
    now = timezone.now()
    with transaction.atomic():
        _lock_job_of(review_id)
        # The conditional UPDATE decides; concurrent approvals or an expiry cannot both win.
        updated = (
            ReviewRequest.objects.filter(
                pk=review_id,
                state=ReviewState.PENDING,
                expires_at__gt=now,
                job__state=JobState.PARKED,
                job__park_reason=ParkReason.WAITING_REVIEW,
            )
            .exclude(requested_by=actor)
            .update(
                state=ReviewState.APPROVED,
                decided_by=actor,
                decided_at=now,
                comment=redact_text(comment, limit=1000),
                expires_at=now + timedelta(seconds=float(settings.KOALA_APPROVAL_TTL_SECONDS)),
            )
        )
        review = _get(review_id)
        if not updated:
            raise SafetyError(decision_blocker(review=review, actor=actor) or f"review {review_id} cannot be approved now.")
        requeued = unpark_jobs(job_ids=[review.job_id], reason=ParkReason.WAITING_REVIEW)
        record_audit(
            actor=actor,
            action=AuditAction.REVIEW_APPROVE,
            target_type="review",
            target_id=review_id,
            details={"job": review.job_id, "digest": review.digest, "comment": review.comment, "requeued": bool(requeued)},
        )
    return review


def reject_review(*, review_id: int, actor: str, comment: str) -> ReviewRequest:
    """Reject a pending review: the job ends failed (review_rejected) and nothing is sent."""
    if not actor:
        raise SafetyError("a rejection needs the reviewer's name.")
    if not comment or not comment.strip():
        raise SafetyError("a rejection needs a comment saying why.")
    _check_decider(review_id=review_id, actor=actor)
    now = timezone.now()
    text = redact_text(comment.strip(), limit=1000)
    with transaction.atomic():
        _lock_job_of(review_id)
        # Only a job parked for this review: the rejection ends it in this same transaction.
        updated = ReviewRequest.objects.filter(
            pk=review_id,
            state=ReviewState.PENDING,
            expires_at__gt=now,
            job__state=JobState.PARKED,
            job__park_reason=ParkReason.WAITING_REVIEW,
        ).update(state=ReviewState.REJECTED, decided_by=actor, decided_at=now, comment=text)
        review = _get(review_id)
        if not updated:
            raise SafetyError(
                decision_blocker(review=review, actor=actor, approving=False) or f"review {review_id} cannot be rejected now."
            )
        _fail_parked(review, reason=FailureReason.REVIEW_REJECTED, message=f"review {review_id} rejected by {actor}: {text}")
        record_audit(
            actor=actor,
            action=AuditAction.REVIEW_REJECT,
            target_type="review",
            target_id=review_id,
            details={"job": review.job_id, "digest": review.digest, "comment": text},
        )
    return review


def _fail_parked(review: ReviewRequest, *, reason: str, message: str) -> None:
    """End the review's job, if it is still parked waiting for a review (the engine's service decides)."""
    fail_parked(
        job_id=review.job_id,
        reason=reason,
        message=message,
        error_class="ReviewRejected" if reason == FailureReason.REVIEW_REJECTED else "ReviewExpired",
        park_reason=ParkReason.WAITING_REVIEW,
    )


def expire_reviews(*, batch: int = 1000) -> int:
    """Pending reviews past their time end their job (review_expired); unused approvals lapse."""
    now = timezone.now()
    count = 0
    due = list(
        ReviewRequest.objects.filter(state__in=[ReviewState.PENDING, ReviewState.APPROVED], expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", "job_id")[:batch]
    )
    for review_id, job_id in due:
        with transaction.atomic():
            # Lock order job, then review (see _lock_job_of). A row someone holds right now (a
            # cancel, a decision, another beat replica) is skipped; the next tick looks again.
            if not list(Job.objects.select_for_update(skip_locked=True).filter(pk=job_id).values_list("pk", flat=True)):
                continue
            review = (
                ReviewRequest.objects.select_for_update(skip_locked=True)
                .filter(pk=review_id, state__in=[ReviewState.PENDING, ReviewState.APPROVED], expires_at__lte=now)
                .first()
            )
            if review is None:
                continue  # decided, withdrawn or expired meanwhile
            was = review.state
            review.state = ReviewState.EXPIRED
            review.save(update_fields=["state"])
            if was == ReviewState.PENDING:
                _fail_parked(review, reason=FailureReason.REVIEW_EXPIRED, message=f"review {review.pk} expired undecided")
            record_audit(
                actor="koala", action=AuditAction.REVIEW_EXPIRED, target_type="review", target_id=review.pk, details={"was": was}
            )
            count += 1
    return count


def withdraw_open_reviews(*, job_id: int, actor: str) -> int:
    """The job ended another way (cancelled): its open reviews can no longer be decided."""
    count = 0
    for review in ReviewRequest.objects.select_for_update().filter(
        job_id=job_id, state__in=[ReviewState.PENDING, ReviewState.APPROVED]
    ):
        review.state = ReviewState.SUPERSEDED
        review.save(update_fields=["state"])
        record_audit(
            actor=actor, action=AuditAction.REVIEW_WITHDRAWN, target_type="review", target_id=review.pk, details={"job": job_id}
        )
        count += 1
    return count


# -- retention (workers.hooks.register_retention) ---------------------------------------------


def keep_jobs_with_open_reviews(job_ids: Sequence[int], cutoff: datetime) -> set[int]:
    """A finished job with a review still open (pending, or approved and unused) stays until the
    review ends (its expiry on the beat); none should remain once a job ends, so this is a guard."""
    return set(
        ReviewRequest.objects.filter(job_id__in=list(job_ids), state__in=OPEN_REVIEW_STATES).values_list("job_id", flat=True)
    )


def forget_reviews(job_ids: Sequence[int]) -> int:
    """Inside a prune batch's transaction: the decided reviews of jobs about to be deleted go with
    them (on_delete CASCADE). Who decided what stays in the audit log (review.* rows)."""
    deleted, _ = ReviewRequest.objects.filter(job_id__in=list(job_ids)).delete()
    return deleted
