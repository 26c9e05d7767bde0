from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from koala import cli
from reviews.models import ReviewRequest, ReviewState
from reviews.services import NotAReviewer, approve_review, reject_review
from workers.errors import SafetyError
from workers.management.commands._common import id_of


class Command(BaseCommand):
    help = (
        "The review queue for critical actions. `list` (pending, oldest first; --all for history), `show ID`, "
        "`approve ID --actor USER [--comment]`, `reject ID --actor USER --comment`. Only a reviewer (an active user "
        "of the reviewers group) decides; four-eyes: whoever enqueued a job cannot approve it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="pending reviews, oldest first")
        listing.add_argument("--all", action="store_true", help="include decided, expired and used reviews")
        show = sub.add_parser("show", help="one review's redacted action")
        show.add_argument("review_id", type=id_of(ReviewRequest))
        for name in ("approve", "reject"):
            decide = sub.add_parser(name, help=f"{name} a pending review")
            decide.add_argument("review_id", type=id_of(ReviewRequest))
            # The review keeps at most this much of the comment; longer is refused, not cut.
            decide.add_argument(
                "--comment",
                type=cli.text(1000, allow_empty=True),
                default="",
                help="why it is rejected (required)" if name == "reject" else "a note kept with the approval (optional)",
            )
            # No default ($USER@cli names no user): the decision names its reviewer, whom the service checks.
            decide.add_argument(
                "--actor",
                type=cli.username(get_user_model()),
                required=True,
                help="the reviewer's user name (an active user of the reviewers group, not the requester)",
            )

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            rows = ReviewRequest.objects.order_by("created_at")
            if not options["all"]:
                rows = rows.filter(state=ReviewState.PENDING)
            now = timezone.now()
            count = 0
            for review in rows:
                count += 1
                age = int((now - review.created_at).total_seconds())
                amount = f"{review.amount_minor} {review.currency}".strip() if review.amount_minor is not None else "-"
                self.stdout.write(
                    f"review {review.pk}  {review.state:<10} job {review.job_id}  {review.action} {review.operation_name}  "
                    f"amount {amount}  target {review.target or '-'}  age {age}s  "
                    f"expires {review.expires_at:%Y-%m-%d %H:%M:%SZ}  requested by {review.requested_by or '-'}"
                    + (f"  decided by {review.decided_by}" if review.decided_by else "")
                )
            if not count:
                self.stdout.write("no pending reviews" if not options["all"] else "no reviews")
            return
        review_id = options["review_id"]
        if action == "show":
            found = ReviewRequest.objects.filter(pk=review_id).first()
            if found is None:
                raise CommandError(f"review {review_id} does not exist.")
            review = found
            self.stdout.write(
                json.dumps(
                    {
                        "id": review.pk,
                        "state": review.state,
                        "job": review.job_id,
                        "digest": review.digest,
                        "summary": review.summary,  # stored redacted
                        "requested_by": review.requested_by,
                        "decided_by": review.decided_by,
                        "comment": review.comment,
                        "expires_at": review.expires_at.isoformat(),
                    },
                    indent=2,
                    default=str,
                )
            )
            return
        actor = options["actor"]
        try:
            if action == "approve":
                review = approve_review(review_id=review_id, actor=actor, comment=options["comment"])
            else:
                review = reject_review(review_id=review_id, actor=actor, comment=options["comment"])
        except NotAReviewer as exc:
            raise CommandError(f"--actor: {exc}") from None
        except SafetyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"review {review.pk} {review.state} by {actor}")
