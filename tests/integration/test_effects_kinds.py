"""The built-in side-effect kinds, run by the real runtime in this process against real
PostgreSQL, Redis, the loopback provider and the SMTP sink.

"Exactly one effect" is always counted in the outside world's own record (the provider's
state file, the sink's message file), and "nothing re-sent" in the provider's request log,
which also sees replays that its idempotency would hide from the effect count.
"""

from __future__ import annotations

from io import StringIO

import pytest

from devtools.sandbox.provider import FakeProvider
from effects.providers import email
from reviews.models import ReviewRequest
from tests.fakes.smtp import SmtpSink
from tests.inprocess import drain, drain_until, run_until
from workers.models import Attempt, Job, Operation
from workers.services import budgets, operations
from workers.services.jobs import enqueue

# transaction=True: bodies run through the real runtime, whose claims need committed rows (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


def shop(reference: str = "o-100", amount: int = 1200, **extra: object) -> int:
    data = {"reference": reference, "amount_minor": amount, "currency": "EUR", **extra}
    return enqueue(kind="shop.order_and_charge", input=data, idempotency_key=f"shop-{reference}").job_id


def ops(job_id: int) -> dict[str, Operation]:
    return {op.name: op for op in Operation.objects.filter(job_id=job_id)}


# -- shop.order_and_charge -------------------------------------------------------------------------
def test_order_then_charge_records_both_operations(provider: FakeProvider, redis_clean: None) -> None:
    job_id = shop()
    job = run_until(job_id, "succeeded")
    [order] = provider.effects("orders")
    [charge] = provider.effects("charges")
    assert (charge["order"], charge["amount_minor"]) == (order["id"], 1200)
    assert job.result == {
        "order": order["id"],
        "charge": charge["id"],
        "status": "succeeded",
        "amount_minor": 1200,
        "currency": "EUR",
    }
    rows = ops(job_id)
    assert rows["order"].key == "shop-o-100:order" and rows["charge"].key == "shop-o-100:charge"
    # The operation key is what the provider saw as the Idempotency-Key.
    assert [e["key"] for e in provider.events("effect")] == ["shop-o-100:order", "shop-o-100:charge"]
    assert (rows["charge"].state, rows["charge"].external_id, rows["charge"].cost_minor) == ("succeeded", charge["id"], 1200)
    assert rows["charge"].params == {"order": order["id"], "amount_minor": 1200, "currency": "EUR"}
    # The provider's answer carried a client secret; only the summary the kind chose is kept.
    assert "client_secret" in charge
    stored = str(Operation.objects.filter(job_id=job_id).values("response", "result", "error_message", "params"))
    assert charge["client_secret"] not in stored and "client_secret" not in stored


def test_rate_limited_charge_is_retried_after_retry_after_and_the_order_is_not_sent_again(
    provider: FakeProvider, redis_clean: None
) -> None:
    provider.fault("429", resource="charges", retry_after=1, times=1)
    job_id = shop("o-429")
    job = run_until(job_id, "succeeded")
    first, second = Attempt.objects.filter(job_id=job_id).order_by("number")
    assert first.outcome == "retry" and "429" in first.error_message
    assert first.finished_at is not None and (second.started_at - first.finished_at).total_seconds() >= 0.9
    assert [r["outcome"] for r in provider.requests("orders")] == ["created"]  # the stored order was reused
    assert [r["outcome"] for r in provider.requests("charges")] == ["rate_limited", "created"]
    assert len(provider.effects("charges")) == 1
    assert job.attempts == 2 and ops(job_id)["charge"].state == "succeeded"


# Issue 3, test 2.
def test_commit_then_timeout_goes_uncertain_then_reconciles_to_one_charge(
    provider: FakeProvider, redis_clean: None, settings
) -> None:
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    settings.KOALA_DRAIN_BATCH = 1  # one attempt per drain: the state between the attempts is observable
    provider.fault("commit_then_timeout", resource="charges", seconds=3, times=1)
    job_id = shop("o-timeout")
    run_until(job_id, "queued")  # the first attempt timed out waiting for the charge's answer
    first = Attempt.objects.get(job_id=job_id, number=1)
    assert first.outcome == "retry" and "outcome unknown" in first.error_message
    charge_op = ops(job_id)["charge"]
    assert charge_op.state == "uncertain"
    assert len(provider.effects("charges")) == 1  # it did happen at the provider

    job = run_until(job_id, "succeeded")
    charge_op.refresh_from_db()
    [charge] = provider.effects("charges")
    assert (charge_op.state, charge_op.resolution, charge_op.external_id) == ("reconciled", "found", charge["id"])
    assert charge_op.cost_minor == 1200
    assert job.result["charge"] == charge["id"]
    assert len(provider.requests("charges")) == 1, "reconciled by lookup, never re-sent"
    assert [e["status"] for e in provider.lookups("charges")] == [200]


# Issue 3, test 3.
def test_unreconcilable_charge_needs_attention_and_nothing_is_resent(provider: FakeProvider, redis_clean: None, settings) -> None:
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    provider.fault("lookup_disabled", resource="charges")
    provider.fault("commit_then_timeout", resource="charges", seconds=3, times=1)
    job_id = shop("o-blind")
    job = run_until(job_id, "parked")
    assert job.park_reason == "needs_attention"
    assert "charge" in job.park_detail and "could not be reconciled" in job.park_detail
    charge_op = ops(job_id)["charge"]
    assert charge_op.state == "uncertain"
    assert list(operations.needing_attention()) == [charge_op]  # what the attention page lists
    # However often workers look, a parked job is not claimed and the charge is not sent again.
    for _ in range(5):
        assert drain() == 0
    assert Job.objects.get(pk=job_id).state == "parked"
    assert len(provider.requests("charges")) == 1
    assert [e["status"] for e in provider.lookups("charges")] == [501]

    # A person checks the provider's dashboard and records that it happened.
    [charge] = provider.effects("charges")
    operations.resolve_operation(
        operation_id=charge_op.pk, happened=True, external_id=charge["id"], note="seen in the provider dashboard", actor="ops-ana"
    )
    job = run_until(job_id, "succeeded")
    assert job.result["charge"] == charge["id"] and job.result["status"] == "resolved_manually"
    assert len(provider.requests("charges")) == 1 and len(provider.effects("charges")) == 1


def test_declined_charge_fails_the_job_terminally_without_a_charge(provider: FakeProvider, redis_clean: None) -> None:
    provider.fault("decline", resource="charges", message="Your card was declined.")
    job = run_until(shop("o-declined"), "failed")
    assert (job.failure_reason, job.attempts) == ("terminal", 1)
    assert "declined" in job.error_message and "card_declined" in job.error_message
    assert ops(job.pk)["charge"].state == "failed"
    assert provider.effects("charges") == [] and len(provider.effects("orders")) == 1


def test_charge_above_the_threshold_waits_for_review_without_charging(provider: FakeProvider, redis_clean: None) -> None:
    job = run_until(shop("o-big", amount=5001), "parked")
    assert job.park_reason == "waiting_review" and job.attempts == 0
    review = ReviewRequest.objects.get(job_id=job.pk)
    assert (review.action, review.operation_name, review.amount_minor, review.state) == ("charge", "charge", 5001, "pending")
    assert provider.effects("charges") == [] and len(provider.effects("orders")) == 1
    # At the threshold itself no review is needed.
    assert run_until(shop("o-edge", amount=5000), "succeeded").result["amount_minor"] == 5000


@pytest.mark.django_db  # refused at enqueue: nothing runs, nothing needs committing
def test_bad_shop_input_is_refused_at_enqueue() -> None:
    from workers.errors import EnqueueError

    for bad in ({"amount_minor": 0}, {"currency": "eur"}, {"amount_minor": "12"}, {"reference": ""}):
        data = {"reference": "o-1", "amount_minor": 100, "currency": "EUR", **bad}
        with pytest.raises(EnqueueError):
            enqueue(kind="shop.order_and_charge", input=data)
    assert not Job.objects.exists()


# -- model.complete --------------------------------------------------------------------------------
def test_model_call_is_priced_by_koala_from_tokens(provider: FakeProvider, redis_clean: None) -> None:
    budgets.set_model_price(model="m-small", input_minor_per_mtok=300_000, output_minor_per_mtok=1_500_000, actor="ops")
    prompt = "x" * 40  # the provider counts 10 input tokens and answers with 13
    job_id = enqueue(kind="model.complete", input={"model": "m-small", "prompt": prompt, "max_tokens": 64}).job_id
    job = run_until(job_id, "succeeded")
    op = ops(job_id)["complete"]
    assert op.usage == {"model": "m-small", "input_tokens": 10, "output_tokens": 13}
    assert op.cost_minor == 23  # ceil((10 * 300_000 + 13 * 1_500_000) / 1e6)
    assert op.estimate_minor == 108  # reserved first, its upper bound: 40 bytes = at most 40 tokens in, 64 out
    assert job.result["usage"]["output_tokens"] == 13 and job.result["completion"] == op.external_id
    assert prompt not in str(Operation.objects.filter(pk=op.pk).values().get())
    attempt = Attempt.objects.get(job_id=job_id)
    assert attempt.usage is not None and attempt.usage["input_tokens"] == 10 and attempt.usage["cost_minor"] == 23


def test_model_call_server_error_is_reconciled_not_repeated(provider: FakeProvider, redis_clean: None, settings) -> None:
    # A 5xx leaves the outcome open: the retry asks the provider before sending again. Without
    # its processing fault the fake provider commits before it answers: its declared processing
    # window is 0, so a miss after the failed send is proof of absence at once.
    settings.KOALA_MODELS_PROCESSING_WINDOW_SECONDS = 0.0
    provider.fault("5xx", resource="completions", status=503, times=1)
    job_id = enqueue(kind="model.complete", input={"model": "m-small", "prompt": "hello", "max_tokens": 16}).job_id
    run_until(job_id, "succeeded")
    assert [e["status"] for e in provider.lookups("completions")] == [404]  # proven absent...
    assert [r["status"] for r in provider.requests("completions")] == [503, 200]  # ...so re-sent once
    op = ops(job_id)["complete"]
    assert op.state == "succeeded" and op.attempts == 2 and len(provider.effects("completions")) == 1


# -- email.send ------------------------------------------------------------------------------------
def test_email_is_sent_once_with_the_operation_key_as_message_identity(smtp_sink: SmtpSink, redis_clean: None) -> None:
    data = {"to": "ana@example.com", "subject": "Welcome", "template": "welcome", "context": {"name": "Ana", "product": "Koala"}}
    job_id = enqueue(kind="email.send", input=data, idempotency_key="welcome-ana").job_id
    job = run_until(job_id, "succeeded")
    [message] = smtp_sink.messages()
    op = ops(job_id)["send"]
    assert message["idempotency_key"] == op.key == "welcome-ana:send"
    assert message["message_id"] == email.message_id(op.key) == op.external_id == job.result["message_id"]
    assert message["rcpt_tos"] == ["ana@example.com"] and message["subject"] == "Welcome"
    assert "Hello Ana," in message["body"] and "Welcome to Koala." in message["body"]
    # Enqueueing the same request again is the same job: no second message.
    assert enqueue(kind="email.send", input=data, idempotency_key="welcome-ana").job_id == job_id
    drain()
    assert len(smtp_sink.messages()) == 1


def test_email_refused_for_now_is_retried_and_sent_once(smtp_sink: SmtpSink, redis_clean: None) -> None:
    smtp_sink.refuse("451 4.3.0 Try again later", times=1)
    data = {"to": ["ana@example.com", "bo@example.com"], "subject": "Receipt", "template": "receipt", "context": {"order": "o-1"}}
    job = run_until(enqueue(kind="email.send", input=data).job_id, "succeeded")
    assert job.attempts == 2
    [message] = smtp_sink.messages()
    assert message["rcpt_tos"] == ["ana@example.com", "bo@example.com"] and "order o-1" in message["body"]


@pytest.mark.django_db  # refused at enqueue: nothing runs, nothing needs committing
def test_email_input_is_checked_at_enqueue() -> None:
    from workers.errors import EnqueueError

    good = {"to": "ana@example.com", "subject": "Hi", "template": "welcome"}
    for bad, why in (
        ({"to": "not-an-address"}, "invalid address"),
        ({"subject": "two\nlines"}, "one line"),
        ({"template": "../../settings"}, "must name a template"),
        ({"template": "nope"}, "no email template"),
        ({"context": {"doc": "x" * 201}}, "references, not documents"),
    ):
        with pytest.raises(EnqueueError, match=why):
            enqueue(kind="email.send", input=good | bad)
    assert not Job.objects.exists()


def test_unconfigured_provider_fails_visibly_before_any_operation(settings, redis_clean: None) -> None:
    settings.KOALA_PAYMENTS_URL = ""
    job = run_until(shop("o-nowhere"), "failed")
    assert (job.failure_reason, job.error_class) == ("terminal", "TerminalFailure:not_configured")
    assert not Operation.objects.filter(job_id=job.pk).exists()


def test_demo_enqueues_the_side_effect_kinds_once(provider: FakeProvider, redis_clean: None, tmp_path, monkeypatch) -> None:
    from django.core import mail
    from django.core.management import call_command

    monkeypatch.setenv("KOALA_DATA_DIR", str(tmp_path))
    call_command("koala_demo", stdout=StringIO())
    call_command("koala_demo", stdout=StringIO())  # safe to run again: the same jobs
    from exports.models import Event, Export

    assert (Event.objects.count(), Export.objects.count()) == (100_000, 1)  # demo data and one export, once
    demo = dict(Job.objects.filter(created_by__in=["koala_demo", "alice"]).values_list("idempotency_key", "kind"))
    assert {k: demo[k] for k in ("demo-email-welcome", "demo-order-1", "demo-order-2", "demo-model-1")} == {
        "demo-email-welcome": "email.send",
        "demo-order-1": "shop.order_and_charge",
        "demo-order-2": "shop.order_and_charge",
        "demo-model-1": "model.complete",
    }
    expected = {
        "demo-email-welcome": "succeeded",
        "demo-order-1": "succeeded",
        "demo-order-2": "parked",
        "demo-model-1": "succeeded",
    }

    def demo_states() -> dict[str, str]:
        return dict(Job.objects.filter(idempotency_key__in=expected).values_list("idempotency_key", "state"))

    drain_until(lambda: demo_states() == expected, what=lambda: f"the demo jobs to be {expected}, not {demo_states()}")
    assert Job.objects.get(idempotency_key="demo-order-2").park_reason == "waiting_review"
    assert [m.subject for m in mail.outbox] == ["Welcome"]  # the test mailer (locmem)
    assert len(provider.effects("charges")) == 1 and len(provider.effects("completions")) == 1
