"""Jobs whose records have unusual shapes, and the pages that show them.

``tests.shapes`` (tests/kinds.py) records one shape of value (no keys, nested lists, huge values,
non-ASCII text, numbers where other kinds keep text, nulls, mixed types) everywhere a body can:
its checkpoint, run state and usage, an operation's parameters, target, result, response and
usage, its own result or error. ``seed_odd_shapes`` runs one job per shape and ending through the
in-process runtime (tests/inprocess.py: the test must commit, ``transaction=True``), with a
declared-sensitive value buried in each shape and free text of pattern-shaped secrets in its input.
``odd_pages`` names every console and admin page that shows them. Used by
tests/integration/test_console_odd_shapes.py and, among all the other records, by the crawl of
tests/acceptance/test_console_crawl.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse

from reviews.models import ReviewRequest
from tests.inprocess import run_until
from tests.kinds import SHAPES
from workers.models import Attempt, Job, Operation
from workers.services.jobs import enqueue

CRITICAL_AMOUNT = 250_000  # above tests.shapes' review threshold: the operation waits for a reviewer


@dataclass(frozen=True)
class OddShapes:
    jobs: list[int]
    parked: list[int]  # needs attention and waiting for review: their pages show an open operation
    reviews: list[int]


def seed_odd_shapes(*, secret: str, note: str) -> OddShapes:
    """One job per shape and ending; ``secret`` goes under the kind's declared-sensitive field (and
    the body buries it in every shape), ``note`` (free text of pattern-shaped secrets) into the input."""
    jobs, parked = [], []
    for shape in SHAPES:
        for ending in ("succeed", "fail"):
            data = {"shape": shape, "secret": secret, "ending": ending, "note": note}
            job_id = enqueue(kind="tests.shapes", input=data, created_by="alice").job_id
            jobs.append(run_until(job_id, "succeeded" if ending == "succeed" else "failed").pk)
    for shape, ending, amount in (("nested", "attention", 1234), ("huge", "succeed", CRITICAL_AMOUNT)):
        data = {"shape": shape, "secret": secret, "ending": ending, "amount_minor": amount}
        job_id = enqueue(kind="tests.shapes", input=data, created_by="alice").job_id
        parked.append(run_until(job_id, "parked").pk)
    reviews = list(ReviewRequest.objects.filter(job_id__in=parked).values_list("pk", flat=True))
    assert len(reviews) == 1, "the critical operation waits for a reviewer"
    return OddShapes(jobs=jobs + parked, parked=parked, reviews=reviews)


def odd_pages(seeded: OddShapes) -> list[str]:
    """Every console and admin page that shows these jobs, their attempts, operations and reviews."""
    ids = seeded.jobs
    attempts = Attempt.objects.filter(job_id__in=ids).values_list("pk", flat=True)
    operations = Operation.objects.filter(job_id__in=ids).values_list("pk", flat=True)
    pages = [
        "/admin/console/",
        "/admin/console/jobs/?kind=tests.shapes",
        *(f"/admin/console/jobs/?kind=tests.shapes&state={state}" for state in ("succeeded", "failed", "parked")),
        "/admin/console/failures/",
        "/admin/console/attention/",
        reverse("reviews:queue"),
        *(reverse("reviews:detail", args=[pk]) for pk in seeded.reviews),
        *(reverse("console:job", args=[pk]) for pk in ids),
        "/admin/workers/job/?kind=tests.shapes",
        "/admin/workers/attempt/",
        "/admin/workers/operation/",
        "/admin/reviews/reviewrequest/",
        *(reverse("admin:workers_job_change", args=[pk]) for pk in ids),
        *(reverse("admin:workers_attempt_change", args=[pk]) for pk in attempts),
        *(reverse("admin:workers_operation_change", args=[pk]) for pk in operations),
        *(reverse("admin:reviews_reviewrequest_change", args=[pk]) for pk in seeded.reviews),
    ]
    assert Job.objects.filter(pk__in=ids, kind="tests.shapes").count() == len(ids)
    return pages
