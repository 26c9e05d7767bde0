"""Who may decide a review: an active user holding the review permission (the reviewers group;
superusers hold every permission), and never the requester (four-eyes). One service rule
(reviews.services), whichever path asks: the command, the console's review page, the admin.
A refused decision changes nothing: the review stays pending, the job parked, no audit row,
nothing sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client, RequestFactory

from koala.models import AuditEvent
from reviews.models import ReviewRequest
from reviews.services import approve_review, reject_review
from tests.inprocess import run_until
from tests.kinds import world_effects
from tests.support.console import ensure_roles, make_user
from workers.errors import SafetyError
from workers.models import Job
from workers.services.jobs import enqueue

# transaction=True: the charge job parks on its review through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)

NOT_A_REVIEWER = "may approve or reject a review"


@pytest.fixture
def people(settings: Any) -> dict[str, User]:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    ensure_roles()
    dave = make_user("dave", "reviewers")
    dave.is_active = False
    dave.save()
    return {
        "alice": make_user("alice", "reviewers"),  # the requester
        "bob": make_user("bob", "reviewers"),
        "carol": make_user("carol", "auditors"),
        "dave": dave,  # a reviewer no longer active
        "root": User.objects.create_superuser("root", "root@example.com", "x"),
    }


@pytest.fixture
def review(tmp_path: Path, redis_clean: None, people: dict[str, User]) -> ReviewRequest:
    job_id = enqueue(kind="tests.charge", input={"world": str(tmp_path / "world.log"), "amount": 6000}, created_by="alice").job_id
    run_until(job_id, "parked")
    return ReviewRequest.objects.get(job_id=job_id)


def _unchanged(review: ReviewRequest, tmp_path: Path) -> None:
    review.refresh_from_db()
    job = Job.objects.get(pk=review.job_id)
    assert (review.state, review.decided_by) == ("pending", "")
    assert (job.state, job.park_reason) == ("parked", "waiting_review")
    assert not AuditEvent.objects.filter(action__in=["review.approve", "review.reject"]).exists()
    assert world_effects(str(tmp_path / "world.log")) == []


@pytest.mark.parametrize(
    ("actor", "reason"),
    [("carol", "'carol' is not a reviewer"), ("zed", "no user named 'zed'"), ("dave", "user 'dave' is inactive")],
)
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_the_command_refuses_a_decider_who_is_not_an_active_reviewer(
    review: ReviewRequest, tmp_path: Path, actor: str, reason: str, decision: str
) -> None:
    with pytest.raises(CommandError, match=reason) as refused:
        call_command("koala_reviews", decision, str(review.pk), "--actor", actor, "--comment", "looks fine")
    assert NOT_A_REVIEWER in str(refused.value)
    _unchanged(review, tmp_path)


def test_the_command_needs_the_deciders_user_name(review: ReviewRequest, tmp_path: Path) -> None:
    # The default actor of other commands ($USER@cli) names no user: a decision names its reviewer.
    with pytest.raises(CommandError, match="--actor"):
        call_command("koala_reviews", "approve", str(review.pk))
    _unchanged(review, tmp_path)


@pytest.mark.parametrize("decide", [approve_review, reject_review])
def test_the_service_refuses_a_non_reviewer_whoever_calls_it(review: ReviewRequest, tmp_path: Path, decide: Any) -> None:
    with pytest.raises(SafetyError, match="'carol' is not a reviewer"):
        decide(review_id=review.pk, actor="carol", comment="ok")
    _unchanged(review, tmp_path)


def test_the_console_refuses_a_non_reviewer_and_says_why(review: ReviewRequest, tmp_path: Path, people: dict[str, User]) -> None:
    carol = Client()
    carol.force_login(people["carol"])
    url = f"/admin/console/reviews/{review.pk}/"
    assert carol.post(f"{url}decide/", {"decision": "approve", "comment": "ok"}).status_code == 403
    page = carol.get(url).content.decode()
    assert "&#x27;carol&#x27; is not a reviewer" in page  # the service's reason, on the disabled buttons
    _unchanged(review, tmp_path)


def test_the_admin_offers_no_decision(review: ReviewRequest, people: dict[str, User]) -> None:
    from django.contrib import admin

    request = RequestFactory().get("/admin/reviews/reviewrequest/")
    request.user = people["root"]
    model_admin = admin.site._registry[ReviewRequest]
    assert model_admin.get_actions(request) == {}
    assert not model_admin.has_change_permission(request, review)


def test_a_reviewer_and_a_superuser_may_decide(review: ReviewRequest, tmp_path: Path, people: dict[str, User]) -> None:
    with pytest.raises(CommandError, match="four-eyes"):
        call_command("koala_reviews", "approve", str(review.pk), "--actor", "alice")
    call_command("koala_reviews", "approve", str(review.pk), "--actor", "bob", "--comment", "fine")
    review.refresh_from_db()
    assert (review.state, review.decided_by) == ("approved", "bob")
    run_until(review.job_id, "succeeded")
    assert len(world_effects(str(tmp_path / "world.log"))) == 1
    second = enqueue(
        kind="tests.charge", input={"world": str(tmp_path / "second.log"), "amount": 7000}, created_by="alice"
    ).job_id
    run_until(second, "parked")
    rejected = reject_review(review_id=ReviewRequest.objects.get(job_id=second).pk, actor="root", comment="duplicate")
    assert rejected.state == "rejected"
