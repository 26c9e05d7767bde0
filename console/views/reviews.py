"""The review queue in the browser: pending critical actions oldest first, the decided
ones as history, and approve/reject with a comment. Four-eyes is enforced by the service
(and a database constraint); the page only explains why a button is disabled."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone

from console.roles import REVIEW, VIEW, actor, page
from console.views.base import render_console
from koala import redaction
from reviews.models import ReviewRequest, ReviewState
from reviews.services import approve_review, decision_blocker, pending_reviews, reject_review
from workers.selectors.jobs import job_for_person


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}))

    def clean(self) -> dict[str, object]:
        cleaned = super().clean() or {}
        if cleaned.get("decision") == "reject" and not (cleaned.get("comment") or "").strip():
            raise forms.ValidationError("Say why you reject it: the comment is required.")
        return cleaned


@page(VIEW)
def queue(request: HttpRequest) -> HttpResponse:
    history = Paginator(
        ReviewRequest.objects.exclude(state=ReviewState.PENDING).select_related("job").order_by("-decided_at", "-created_at"), 30
    )
    return render_console(
        request,
        "reviews/queue.html",
        title="Review queue",
        pending=list(pending_reviews()[:200]),
        history=history.get_page(request.GET.get("page")),
        now=timezone.now(),
    )


def _render_detail(request: HttpRequest, review: ReviewRequest, form: DecisionForm, *, status: int = 200) -> HttpResponse:
    who = actor(request)
    # The service's one rule (a reviewer, not the requester, a review open to a decision) says
    # why a button is disabled; the decision itself asks it again.
    approve_blocker = decision_blocker(review=review, actor=who)
    reject_blocker = decision_blocker(review=review, actor=who, approving=False)
    record = job_for_person(job_id=review.job_id, actor=who)  # the job's context; the read is audited
    redaction.extend(record.redactor)  # for what the template masks itself (|redacted), and any error report
    response = render_console(
        request,
        "reviews/detail.html",
        title=f"Review {review.pk}: {review.action}",
        review=review,
        summary=record.redactor.data(review.summary),
        record=record,
        form=form,
        approve_blocker=approve_blocker,
        reject_blocker=reject_blocker,
    )
    response.status_code = status
    return response


@page(VIEW)
def detail(request: HttpRequest, review_id: int) -> HttpResponse:
    review = get_object_or_404(ReviewRequest.objects.select_related("job"), pk=review_id)
    return _render_detail(request, review, DecisionForm())


@page(REVIEW, methods=("POST",))
def decide(request: HttpRequest, review_id: int) -> HttpResponse:
    review = get_object_or_404(ReviewRequest.objects.select_related("job"), pk=review_id)
    form = DecisionForm(request.POST)
    if form.is_valid():
        comment = form.cleaned_data["comment"]
        try:
            if form.cleaned_data["decision"] == "approve":
                approve_review(review_id=review.pk, actor=actor(request), comment=comment)
                messages.success(request, f"Review {review.pk} approved: job {review.job_id} runs the action once.")
            else:
                reject_review(review_id=review.pk, actor=actor(request), comment=comment)
                messages.success(request, f"Review {review.pk} rejected: job {review.job_id} ends without the action.")
        except ValueError as exc:
            form.add_error(None, str(exc))
        else:
            return HttpResponseRedirect(reverse("reviews:queue"))
    review.refresh_from_db()
    return _render_detail(request, review, form, status=400)
