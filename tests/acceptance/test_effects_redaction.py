"""Issue 3, test 9, with a real worker subprocess: secrets planted in a job's input, in the
provider's error messages and in its answers never reach Koala's records, the worker's log output
(at DEBUG level) or koala_reviews (tests/integration/test_effects_redaction.py has the in-process cases)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from devtools.sandbox.provider import FakeProvider
from koala.models import AuditEvent
from reviews.models import ReviewRequest
from tests.integration.test_effects_redaction import TOKEN
from tests.support.effects import PROVIDER_API_KEY, effects_env
from tests.support.fleet import wait_state, wait_workers_ready
from workers.models import Attempt, Job, Operation
from workers.services.jobs import enqueue

# transaction=True: a real worker subprocess needs committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


CARD = "4242 4242 4242 4242"  # passes the Luhn check, like a real card number
NEEDLES = (TOKEN, CARD, CARD.replace(" ", ""), PROVIDER_API_KEY)


def rows_as_text(job_ids: list[int]) -> str:
    """Every column of every row Koala keeps about these jobs' effects, as text."""
    operations = list(Operation.objects.filter(job_id__in=job_ids).values())
    data = {
        "operations": operations,
        "attempts": list(Attempt.objects.filter(job_id__in=job_ids).values()),
        "reviews": list(ReviewRequest.objects.filter(job_id__in=job_ids).values()),
        "audit": list(AuditEvent.objects.values()),
        # The job's failure record (its input is the job's own data, shown redacted in the admin).
        "jobs": list(
            Job.objects.filter(pk__in=job_ids).values("error_class", "error_message", "park_detail", "parked_on", "result")
        ),
    }
    return json.dumps(data, default=str)


def _around(text: str, needle: str) -> str:
    at = text.find(needle)
    return text[max(at - 300, 0) : at + len(needle) + 50]


def command(*args: str) -> str:
    out = StringIO()
    call_command("koala_reviews", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.slow
def test_secrets_in_input_errors_and_answers_stay_out_of_records_logs_and_reviews(
    processes, provider: FakeProvider, reviewers: object
) -> None:
    secret_text = f"pay with {CARD}, auth {TOKEN}"
    # The order step first gets a 5xx whose message carries the secrets (outcome unknown:
    # the error is stored), then is reconciled and re-sent; the provider's answers echo the
    # reference and description; the charge waits for review, then is declined with a
    # message that carries the secrets again.
    env = effects_env(provider, LOG_LEVEL="DEBUG")
    worker = processes.worker("--name", "redaction", env=env)
    processes.beat(env=env)
    wait_workers_ready([worker])

    # A small order: charged at once; the provider's answers echo the secrets (and a client secret).
    small = enqueue(
        kind="shop.order_and_charge",
        input={"reference": f"o-10 {TOKEN}", "amount_minor": 900, "currency": "EUR", "description": secret_text},
        created_by="alice",
    ).job_id
    assert wait_state(small, "succeeded", timeout=40).result["status"] == "succeeded"

    # A big one: its order first gets a 5xx whose message carries the secrets (outcome unknown,
    # the error is stored), is reconciled as absent and re-sent; its charge waits for review,
    # then is declined with a message that carries the secrets again.
    provider.fault("5xx", resource="orders", status=500, message=f"upstream failed for {secret_text}", times=1)
    big = enqueue(
        kind="shop.order_and_charge",
        input={"reference": f"o-9 {TOKEN}", "amount_minor": 7000, "currency": "EUR", "description": secret_text},
        created_by="alice",
    ).job_id
    assert wait_state(big, "parked", timeout=40).park_reason == "waiting_review"
    provider.fault("decline", resource="charges", message=f"Card {CARD} declined; token {TOKEN} revoked", times=1)

    review = ReviewRequest.objects.get(job_id=big)
    listing = command("list") + command("show", str(review.pk))
    assert f"review {review.pk}" in listing and "charge" in listing
    decided = command("approve", str(review.pk), "--actor", "bob", "--comment", "ok")
    failed = wait_state(big, "failed", timeout=40)
    assert failed.failure_reason == "terminal" and "declined" in failed.error_message
    listing += decided + command("list", "--all")

    # The secrets really were there to leak.
    answers = json.dumps(provider.effects())
    assert TOKEN in answers and CARD in answers and "_secret_" in answers
    assert TOKEN in json.dumps(Job.objects.get(pk=big).input)
    assert [r["status"] for r in provider.requests("orders", key=f"koala-job-{big}:order")] == [500, 200]
    assert Operation.objects.filter(job_id=big, name="order", attempts=2).exists(), "the order went uncertain and was re-sent"

    records = rows_as_text([big, small])
    logs = processes.logs()
    client_secrets = [e["client_secret"] for e in provider.effects("charges")]
    assert client_secrets, "the small job's charge answered with a client secret"
    for needle in (*NEEDLES, *client_secrets):
        assert needle not in records, f"{needle!r} is stored in Koala's records: ...{_around(records, needle)}..."
        assert needle not in logs, f"{needle!r} is in the worker's log output"
        assert needle not in listing, f"{needle!r} is in koala_reviews output"
    # What was masked is still recognisable as masked, not silently dropped.
    assert "[redacted]" in records and "[redacted]" in listing
    # The worker did log the provider's failures (with their secret-bearing messages), masked: the
    # message echoes the whole description, a declared-sensitive value, so all of it is masked.
    assert "upstream failed for [redacted];" in logs and "card_declined" in logs
