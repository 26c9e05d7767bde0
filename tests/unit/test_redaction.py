from __future__ import annotations

import logging

from koala.redaction import MASK, RedactingFilter, redact_data, redact_text, scrub_sentry_event, sensitive_values

SECRETS = [
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTYifQ.c2lnbmF0dXJlc2ln",
    "api_key=abcd1234efgh5678",
    "password: hunter2hunter2",
    "sk_live_51HxYzAbCdEfGhIjK",
    "sk-proj-abcdefghijklmnopqrstuv",
    "AKIAABCDEFGHIJKLMNOP",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
    "postgres://app:s3cretpass@db.internal:5432/app",
]


def test_patterns_mask_credentials_in_free_text() -> None:
    for secret in SECRETS:
        text = f"call failed: {secret} (retry later)"
        out = redact_text(text)
        assert MASK in out, secret
        assert "retry later" in out
    assert "hunter2hunter2" not in redact_text("password: hunter2hunter2")
    assert "s3cretpass" not in redact_text("postgres://app:s3cretpass@db/app")
    assert "sk_live_51HxYzAbCdEfGhIjK" not in redact_text("key sk_live_51HxYzAbCdEfGhIjK used")


def test_known_secret_values_are_masked_wherever_they_appear() -> None:
    data = {"card": "4242424242424242", "user": {"email": "a@b.c", "token": "t0k3n-value"}}
    values = sensitive_values(data, sensitive={"card"})
    assert set(values) == {"4242424242424242", "t0k3n-value"}
    out = redact_text("declined 4242424242424242 / t0k3n-value", secrets=values)
    assert "4242" not in out and "t0k3n" not in out


def test_redact_data_masks_declared_and_always_sensitive_keys() -> None:
    data = {"card": "4242", "prompt": "tell me secrets", "nested": [{"password": "p"}], "n": 3, "ok": "fine"}
    assert redact_data(data, sensitive={"card"}) == {
        "card": MASK,
        "prompt": MASK,
        "nested": [{"password": MASK}],
        "n": 3,
        "ok": "fine",
    }


def test_messages_are_bounded() -> None:
    assert len(redact_text("x" * 10_000)) == 500


def test_log_filter_redacts_message_args_and_exception_text() -> None:
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "token %s", ("Bearer abcdefghijklmnop",), None)
    try:
        raise ValueError("api_key=zzzzzzzzzzzz")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    rendered = logging.Formatter().format(record)
    assert "abcdefghijklmnop" not in rendered and "zzzzzzzzzzzz" not in rendered
    assert "Traceback" not in rendered


def test_sentry_events_are_scrubbed() -> None:
    event = {
        "message": "failed with Bearer abcdefghijklmnopq",
        "exception": {"values": [{"value": "password=letmeinletmein", "stacktrace": {"frames": [{"vars": {"card": "4242"}}]}}]},
        "breadcrumbs": {"values": [{"message": "GET ?api_key=qqqqqqqqqqqq", "data": {"card": "4242"}}]},
        "request": {"headers": {"Authorization": "Bearer x", "X-Api-Key": "k"}, "cookies": {"sessionid": "s"}, "data": "body"},
    }
    scrubbed = scrub_sentry_event(event, {})
    flat = repr(scrubbed)
    for leaked in ("abcdefghijklmnopq", "letmeinletmein", "qqqqqqqqqqqq", "4242", "sessionid", "'body'"):
        assert leaked not in flat, leaked
