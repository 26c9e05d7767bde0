"""Real engine states for the console tests, reached through the real runtime (in this
process) against the loopback provider: no row is written by hand."""

from __future__ import annotations

from devtools.sandbox.provider import FakeProvider
from reviews.models import ReviewRequest
from tests.inprocess import run_until
from workers.models import Job, Operation
from workers.services.jobs import enqueue

CARD, BEARER = "4111111111111111", "tok_live_zyxwvutsrqponmlk"  # planted secrets (tests.kinds "boom")


def shop(reference: str, amount: int, *, created_by: str = "") -> int:
    data = {"reference": reference, "amount_minor": amount, "currency": "EUR"}
    return enqueue(kind="shop.order_and_charge", input=data, idempotency_key=f"shop-{reference}", created_by=created_by).job_id


def pending_review(*, requested_by: str) -> ReviewRequest:
    """A charge above the review threshold: the job parks waiting_review with one pending review."""
    job = run_until(shop("o-review", 6000, created_by=requested_by), "parked")
    return ReviewRequest.objects.get(job_id=job.pk, state="pending")


def uncertain_charge(provider: FakeProvider, settings) -> Operation:  # type: ignore[no-untyped-def]
    """A charge that happened at the provider, whose answer was lost and cannot be looked up."""
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    provider.fault("lookup_disabled", resource="charges")
    provider.fault("commit_then_timeout", resource="charges", seconds=2, times=1)
    job = run_until(shop("o-blind", 1200), "parked")
    assert job.park_reason == "needs_attention"
    return Operation.objects.get(job_id=job.pk, name="charge", state="uncertain")


def failed_job_with_secrets() -> Job:
    job_id = enqueue(kind="boom", input={"card": CARD, "bearer": BEARER, "order": "A-1"}).job_id
    return run_until(job_id, "failed")
