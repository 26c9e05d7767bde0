"""Koala's provider clients against the real loopback servers: each way a call can end maps to
the ledger's error class, and the fakes behave like the services they stand in for."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from devtools.sandbox.provider import FakeProvider, ProviderControl
from effects.providers import email, models, payments
from effects.providers.http import retry_after_seconds
from tests.conftest import REPO, wait_for
from tests.fakes.smtp import SmtpSink, free_port
from tests.support.effects import PROVIDER_API_KEY
from workers.errors import Declined, NotPerformed, OutcomeUnknown
from workers.ledger import Miss, Processing


def order(client: payments.PaymentsClient, key: str, amount: int = 1200) -> dict:
    return client.create_order(key=key, reference="o-1", amount_minor=amount, currency="EUR")


# -- payments and the provider's idempotency -----------------------------------------------------
def test_same_key_same_body_is_one_effect_and_other_body_is_refused(provider: FakeProvider) -> None:
    client = payments.client()
    first = order(client, "k-1")
    again = order(client, "k-1")
    assert again == first
    assert len(provider.effects("orders")) == 1
    assert [r["outcome"] for r in provider.requests("orders")] == ["created", "replayed"]
    with pytest.raises(Declined, match=r"422.*idempotency_key_reused"):
        order(client, "k-1", amount=1300)
    assert len(provider.effects("orders")) == 1
    charge = client.charge(key="k-1:charge", order=first["id"], amount_minor=1200, currency="EUR")
    assert (charge["order"], charge["amount_minor"], charge["status"]) == (first["id"], 1200, "succeeded")


def test_lookup_found_absent_and_disabled(provider: FakeProvider, settings) -> None:
    client = payments.client()
    created = order(client, "k-2")
    assert client.lookup_order("k-2") == created
    # A miss carries the provider's processing window: the ledger decides whether it proves absence.
    window = settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS
    assert client.lookup_order("never-sent") == Miss(window)
    assert client.lookup_charge("k-2") == Miss(window)  # keys are per resource, like the provider's
    provider.fault("lookup_disabled", resource="orders")
    assert client.lookup_order("k-2") is None
    assert client.lookup_charge("k-2") == Miss(window)
    assert [e["status"] for e in provider.lookups("orders")] == [200, 404, 501]


def test_lookup_disabled_for_a_number_of_lookups(provider: FakeProvider) -> None:
    client = payments.client()
    created = order(client, "k-2b")
    provider.fault("lookup_disabled", resource="orders", times=2)
    assert [client.lookup_order("k-2b") for _ in range(3)] == [None, None, created]
    assert [e["status"] for e in provider.lookups("orders")] == [501, 501, 200]


def test_rate_limit_is_not_performed_with_retry_after(provider: FakeProvider) -> None:
    provider.fault("429", retry_after=7, times=1)
    with pytest.raises(NotPerformed) as caught:
        order(payments.client(), "k-3")
    assert caught.value.retry_after == 7
    assert provider.effects() == []
    order(payments.client(), "k-3")  # the fault was for one request only
    assert len(provider.effects("orders")) == 1


def test_server_error_is_outcome_unknown(provider: FakeProvider) -> None:
    provider.fault("5xx", status=502, times=1)
    with pytest.raises(OutcomeUnknown, match="HTTP 502"):
        order(payments.client(), "k-4")


def test_commit_then_timeout_is_outcome_unknown_and_the_lookup_finds_the_effect(provider: FakeProvider, settings) -> None:
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.5
    provider.fault("commit_then_timeout", seconds=3, times=1)
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown, match="timed out after the request was sent"):
        order(payments.client(), "k-5")
    assert time.monotonic() - started < 2.5, "the client's timeout, not the provider's hold, ended the call"
    [effect] = provider.effects("orders", key="k-5")
    assert payments.client().lookup_order("k-5")["id"] == effect["id"]


def test_decline_bad_request_and_bad_credentials_are_declined(provider: FakeProvider, settings) -> None:
    client = payments.client()
    created = order(client, "k-6")
    provider.fault("decline", resource="charges", message="Your card was declined.", times=1)
    with pytest.raises(Declined, match=r"402.*card_declined"):
        client.charge(key="k-6:charge", order=created["id"], amount_minor=1200, currency="EUR")
    with pytest.raises(Declined, match=r"404.*resource_missing"):
        client.charge(key="k-7:charge", order="ord_missing", amount_minor=1200, currency="EUR")
    settings.KOALA_PAYMENTS_API_KEY = "sk_test_wrongwrongwrongwrong"
    with pytest.raises(Declined, match="401") as caught:
        order(payments.client(), "k-8")
    assert "sk_test_wrong" not in str(caught.value) and PROVIDER_API_KEY not in str(caught.value)
    assert [e["key"] for e in provider.events("effect")] == ["k-6"]


def test_connection_refused_is_not_performed(settings) -> None:
    settings.KOALA_PAYMENTS_URL = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(NotPerformed, match=r"could not connect \(connection refused\); nothing was sent"):
        order(payments.client(), "k-9")
    with pytest.raises(NotPerformed):
        payments.client().lookup_order("k-9")  # a failed lookup raises: the ledger cannot tell


def test_a_key_in_use_by_a_concurrent_request_is_outcome_unknown(provider: FakeProvider) -> None:
    # The request under the key may yet take effect: "key in use" leaves the outcome open.
    provider.fault("slow", seconds=1.0, times=1)
    results: list[object] = []

    def first() -> None:
        results.append(order(payments.client(), "k-10"))

    thread = threading.Thread(target=first)
    thread.start()
    # The provider took the slow fault: the first request holds the key and is being processed.
    wait_for(
        lambda: [f["times"] for f in provider.stats()["faults"] if f["name"] == "slow"] == [0],
        timeout=10,
        what="the first request to reach the provider",
    )
    with pytest.raises(OutcomeUnknown, match=r"409.*idempotency_key_in_use.*still being processed"):
        order(payments.client(), "k-10")
    thread.join()
    assert len(results) == 1 and len(provider.effects("orders")) == 1


@pytest.mark.parametrize("lookup", ["miss", "processing"])
def test_a_request_still_processing_is_open_to_lookups_and_re_sends_until_it_commits(
    provider: FakeProvider, settings, lookup: str
) -> None:
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 0.3
    provider.fault("processing", resource="orders", seconds=1.5, lookup=lookup, times=1)
    client = payments.client()
    with pytest.raises(OutcomeUnknown, match="timed out after the request was sent"):
        order(client, "k-proc")
    window = settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS
    assert client.lookup_order("k-proc") == (Miss(window) if lookup == "miss" else Processing(window))
    with pytest.raises(OutcomeUnknown, match=r"409.*idempotency_key_in_use"):
        order(client, "k-proc")  # a re-send under the key while it is processing
    assert provider.effects("orders") == [] and len(provider.accepted("orders", key="k-proc")) == 1
    [effect] = wait_for(lambda: provider.effects("orders", key="k-proc"), timeout=5, what="the commit")  # type: ignore[misc]
    assert client.lookup_order("k-proc") == effect
    assert order(client, "k-proc") == effect  # now a replay, no second effect
    assert [r["outcome"] for r in provider.requests("orders")] == ["accepted", "idempotency_key_in_use", "replayed"]
    assert [e["status"] for e in provider.lookups("orders")] == [404 if lookup == "miss" else 202, 200]


def test_not_configured_is_a_visible_terminal_failure(settings) -> None:
    from workers.errors import TerminalFailure

    settings.KOALA_PAYMENTS_URL = ""
    with pytest.raises(TerminalFailure, match="KOALA_PAYMENTS_URL is not set"):
        payments.client()


def test_retry_after_forms() -> None:
    assert retry_after_seconds("3") == 3
    assert retry_after_seconds("-1") == 0
    assert retry_after_seconds(None) is None and retry_after_seconds("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= (retry_after_seconds(later) or 0) <= 31


# -- the model API ----------------------------------------------------------------------------------
def test_model_call_reports_token_usage_and_is_idempotent(provider: FakeProvider) -> None:
    client = models.client()
    prompt = "x" * 40
    answer = client.complete(key="m-1", model="m-small", prompt=prompt, max_tokens=64)
    assert answer["usage"] == {"input_tokens": 10, "output_tokens": 13}
    assert client.complete(key="m-1", model="m-small", prompt=prompt, max_tokens=64) == answer
    assert client.lookup("m-1") == answer
    with pytest.raises(Declined, match="model_not_found"):
        client.complete(key="m-2", model="m-unknown", prompt=prompt, max_tokens=64)
    assert len(provider.effects("completions")) == 1


def test_slow_fault_measures_concurrency(provider: FakeProvider) -> None:
    provider.fault("slow", seconds=0.5, resource="completions")
    threads = [
        threading.Thread(
            target=models.client().complete, kwargs={"key": f"c-{n}", "model": "m-small", "prompt": "hi", "max_tokens": 8}
        )
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = provider.stats()
    assert stats["max_in_flight"]["completions"] == 3
    assert stats["in_flight"]["completions"] == 0
    provider.reset()
    assert provider.stats()["max_in_flight"]["completions"] == 0


# -- the provider as a process: shared by processes and kept across restarts --------------------
@pytest.mark.slow  # the provider as a subprocess
def test_provider_process_keeps_its_record_across_a_restart(tmp_path: Path, settings) -> None:
    state = tmp_path / "state.jsonl"
    port = free_port()

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.sandbox.provider", "--port", str(port), "--state", str(state)],
            cwd=REPO,
            env={**os.environ, "FAKE_PROVIDER_API_KEY": PROVIDER_API_KEY},
            stdout=subprocess.PIPE,
        )
        assert proc.stdout is not None
        assert b"listening on" in proc.stdout.readline()
        return proc

    settings.KOALA_PAYMENTS_URL = f"http://127.0.0.1:{port}"
    settings.KOALA_PAYMENTS_API_KEY = PROVIDER_API_KEY
    proc = start()
    try:
        created = order(payments.client(), "k-restart")
        proc.kill()  # kill -9: only the fsync'ed record survives
        proc.wait(timeout=10)
        proc = start()
        assert payments.client().lookup_order("k-restart") == created
        assert order(payments.client(), "k-restart") == created  # replayed, not created again
        control = ProviderControl(f"http://127.0.0.1:{port}", state)
        assert len(control.effects("orders")) == 1
        assert [r["outcome"] for r in control.requests("orders")] == ["created", "replayed"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0


# -- email through Django's mailer ----------------------------------------------------------------
def test_email_is_sent_with_a_message_id_derived_from_the_key(smtp_sink: SmtpSink) -> None:
    sent = email.send(key="job-1:send", to=["ana@example.com"], subject="Hello", body="Hi Ana\n")
    again = email.send(key="job-1:send", to=["ana@example.com"], subject="Hello", body="Hi Ana\n")
    assert sent == again == {"message_id": email.message_id("job-1:send"), "recipients": 1}
    messages = smtp_sink.messages(idempotency_key="job-1:send")
    # SMTP has no idempotency: two sends are two deliveries, with one Message-ID to dedupe by.
    assert [m["message_id"] for m in messages] == [sent["message_id"]] * 2
    assert messages[0]["rcpt_tos"] == ["ana@example.com"] and messages[0]["subject"] == "Hello"
    assert email.message_id("job-2:send") != sent["message_id"]


def test_email_errors_map_to_the_ledger_classes(smtp_sink: SmtpSink, settings) -> None:
    smtp_sink.refuse("451 4.3.0 Try again later", times=1)
    with pytest.raises(NotPerformed, match="code 451"):
        email.send(key="e-1", to=["a@example.com"], subject="s", body="b")
    smtp_sink.refuse("550 5.7.1 Rejected", times=1)
    with pytest.raises(Declined, match="code 550"):
        email.send(key="e-2", to=["a@example.com"], subject="s", body="b")
    smtp_sink.hold(3)
    settings.MAILERS["default"]["OPTIONS"]["timeout"] = 0.5
    with pytest.raises(OutcomeUnknown, match="may have been delivered"):
        email.send(key="e-3", to=["a@example.com"], subject="s", body="b")
    smtp_sink.hold(0)
    assert [m["idempotency_key"] for m in smtp_sink.messages()] == ["e-3"]  # delivered, though we could not tell
    settings.MAILERS["default"]["OPTIONS"]["port"] = free_port()
    with pytest.raises(NotPerformed, match="nothing was sent"):
        email.send(key="e-4", to=["a@example.com"], subject="s", body="b")


@pytest.mark.slow  # Django set up in a subprocess
def test_bad_provider_url_stops_start_up(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": "postgres://x@127.0.0.1/x", "REDIS_URL": "redis://127.0.0.1:6379/0"}
    env["KOALA_PAYMENTS_URL"] = "ftp://provider.example"
    key_file = tmp_path / "key"
    key_file.write_text("sk_from_file\n")
    env["KOALA_MODELS_API_KEY_FILE"] = str(key_file)
    code = "import django; django.setup(); from django.conf import settings; print(settings.KOALA_MODELS_API_KEY)"
    bad = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env | {"DJANGO_SETTINGS_MODULE": "koala.settings"}, capture_output=True
    )
    assert bad.returncode == 2
    assert b"KOALA_PAYMENTS_URL must be an http:// or https:// URL" in bad.stderr
    env["KOALA_PAYMENTS_URL"] = "https://provider.example/"
    good = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env | {"DJANGO_SETTINGS_MODULE": "koala.settings"}, capture_output=True
    )
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == b"sk_from_file"
