"""koala.redaction's masks, one behaviour at a time: what is masked, what is kept, and the bounds
of each credential shape (one character short of a shape must stay readable)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

from koala.redaction import (
    MASK,
    RedactingFilter,
    is_sensitive_key,
    redact_data,
    redact_text,
    restore_logged_exception,
    scrub_sentry_event,
    sensitive_values,
)
from tests.planted import planted


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("card 4242 4242 4242 4242 ok", f"card {MASK} ok"),  # Luhn-valid, grouped by spaces
        ("card 4242-4242-4242-4242 ok", f"card {MASK} ok"),  # ...or by dashes
        ("amex 378282246310005 ok", f"amex {MASK} ok"),  # 15 digits
        ("card 4242-4242-4242-4241 ok", "card 4242-4242-4242-4241 ok"),  # fails the Luhn check
        ("order 1700000000000 at", "order 1700000000000 at"),  # epoch milliseconds: 13 digits, not Luhn
        ("id 123456789012 x", "id 123456789012 x"),  # 12 digits: too short for a card
    ],
)
def test_card_numbers_are_masked_only_when_they_pass_the_luhn_check(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sent Bearer abcdefgh", f"sent Bearer {MASK}"),
        ("basic QWxhZGRpbjpvcGVu", f"basic {MASK}"),
        ("token abcdefgh12", f"token {MASK}"),
        ("token abc", "token abc"),  # shorter than any credential: kept
        ("api_key=abc&page=2", f"api_key={MASK}&page=2"),  # stops at the query separator
        ('password="a b c" end', f"password={MASK} end"),  # a quoted value goes whole
        ("secret: 'x y'", f"secret: {MASK}"),
        ("apikey = zzz", f"apikey = {MASK}"),
        ("client-secret: abc;", f"client-secret: {MASK};"),
        ("postgres://app:s3cret@db:5432/x", f"postgres://app:{MASK}@db:5432/x"),
        ("the secretary said", "the secretary said"),  # a key name only as a whole word
    ],
)
def test_credentials_in_free_text_keep_their_label(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_an_authorization_header_keeps_only_its_name() -> None:
    out = redact_text("Authorization: Bearer abcdefgh12")
    assert out.startswith("Authorization: ") and "abcdefgh12" not in out and "Bearer" not in out


@pytest.mark.parametrize(
    ("credential", "masked"),
    [
        ("sk_live_" + "a" * 8, True),
        ("tok_test_" + "a" * 8, True),
        ("tok_live_" + "a" * 7, False),
        ("sk-" + "a" * 16, True),
        ("sk-" + "a" * 15, False),
        ("AKIA" + "A" * 16, True),
        ("AKIA" + "A" * 15, False),
        ("ghp_" + "a" * 20, True),
        ("gho_" + "a" * 19, False),
        ("eyJ" + "a" * 8 + ".b" + "b" * 7 + ".c" + "c" * 7, True),
        ("eyJ" + "a" * 7 + ".b" + "b" * 7 + ".c" + "c" * 7, False),
    ],
)
def test_credential_shapes_are_masked_from_their_minimum_length(credential: str, masked: bool) -> None:
    out = redact_text(f"used {credential} here")
    assert (out == f"used {MASK} here") is masked, out
    assert (credential in out) is not masked


def test_known_secret_values_are_masked_but_not_short_or_non_text_ones() -> None:
    assert redact_text("abcd and abc", secrets=["abcd"]) == f"{MASK} and abc"
    assert redact_text("ab cd", secrets=["ab"]) == "ab cd"  # under 4 characters would mask half the text
    assert redact_text("value 12345", secrets=[12345, None]) == "value 12345"  # type: ignore[list-item]


def test_the_length_bound_is_exact_and_marks_the_cut() -> None:
    assert redact_text("x" * 500) == "x" * 500
    cut = redact_text("x" * 501)
    assert len(cut) == 500 and cut.endswith("x…")
    assert redact_text("y" * 20, limit=10) == "y" * 9 + "…"


def test_masking_happens_before_the_cut() -> None:
    # A secret straddling the bound is masked whole, not cut into a readable prefix.
    out = redact_text("x" * 490 + " api_key=" + "z" * 30)
    assert out == "x" * 490 + " api_key=…"


def test_extra_patterns_from_settings_are_masked_too(settings: Any) -> None:
    settings.KOALA_REDACT_EXTRA_PATTERNS = [r"ACME-\d{6}"]
    assert redact_text("customer ACME-123456 called") == f"customer {MASK} called"
    settings.KOALA_REDACT_EXTRA_PATTERNS = []
    assert redact_text("customer ACME-123456 called") == "customer ACME-123456 called"


@pytest.mark.parametrize(
    ("key", "declared", "sensitive"),
    [
        ("password", (), True),
        ("AUTHORIZATION", (), True),
        ("Prompt", (), True),
        ("card", ("CARD",), True),
        ("name", (), False),
        ("card", (), False),
        ("passwords", (), False),  # exact names, not substrings
    ],
)
def test_sensitive_keys_are_exact_names_in_any_case(key: str, declared: tuple[str, ...], sensitive: bool) -> None:
    assert is_sensitive_key(key, declared) is sensitive


def test_redact_data_masks_keys_at_any_depth_and_keeps_the_shape() -> None:
    data = {
        "Password": "p",
        "nested": {"ApiKey": "z", "ok": ["fine", {"token": "t"}]},
        "pair": (1, "x"),
        "flag": True,
        "count": 3,
        "note": "Bearer abcdefghij",
    }
    assert redact_data(data) == {
        "Password": MASK,
        "nested": {"ApiKey": MASK, "ok": ["fine", {"token": MASK}]},
        "pair": [1, "x"],  # tuples come back as lists (JSON)
        "flag": True,
        "count": 3,
        "note": f"Bearer {MASK}",
    }


def test_redact_data_masks_card_numbers_stored_as_integers() -> None:
    out = redact_data({"a": 4242424242424242, "b": 4242424242424241, "c": 1700000000000, "d": -4242424242424242})
    assert out == {"a": MASK, "b": 4242424242424241, "c": 1700000000000, "d": MASK}


def test_redact_data_masks_known_values_inside_other_strings() -> None:
    out = redact_data({"message": "charge for acct-9911 failed"}, secrets=["acct-9911"])
    assert out == {"message": f"charge for {MASK} failed"}


def test_sensitive_values_collects_every_value_under_a_sensitive_key() -> None:
    data = {"card": {"n": 1, "z": None, "l": ["a", 2]}, "x": [{"token": "t"}], "ok": "v"}
    assert sensitive_values(data, sensitive={"CARD"}) == ["1", "a", "2", "t"]
    assert sensitive_values(["loose", {"ok": "v"}]) == []


def _record(msg: str, args: tuple[Any, ...] = (), exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("t", logging.ERROR, __file__, 1, msg, args, exc_info)


def test_the_log_filter_keeps_a_record_whose_format_is_broken() -> None:
    record = _record("two %s %s", ("api_key=zzzzzzzz",))  # one argument short
    assert RedactingFilter().filter(record) is True
    assert record.args is None and "two %s %s" in record.getMessage()


def test_the_log_filter_folds_the_exception_into_the_message_redacted() -> None:
    record = _record("call failed", exc=ValueError("password=hunter2hunter2"))
    assert RedactingFilter().filter(record)
    assert record.exc_info is None and record.exc_text is None
    assert record.getMessage() == f"call failed [ValueError: password={MASK}]"


def test_sentry_logentries_extras_and_headers_are_scrubbed() -> None:
    event: dict[str, Any] = {
        "logentry": {"message": "token %s", "formatted": "token abcdefghijkl", "params": ["abcdefghijkl"]},
        "extra": {"password": "p", "job": 7},
        "request": {"headers": {"X-Api-Key": "k", "Accept": "json"}},
    }
    scrubbed = scrub_sentry_event(event, {})
    assert scrubbed["logentry"] == {"message": "token %s", "formatted": f"token {MASK}"}
    assert scrubbed["extra"] == {"password": MASK, "job": 7}
    assert scrubbed["request"]["headers"] == {"X-Api-Key": MASK, "Accept": "json"}


def test_sentry_events_without_those_parts_pass_unchanged() -> None:
    event: dict[str, Any] = {"level": "error", "exception": {"values": None}, "breadcrumbs": None}
    assert scrub_sentry_event(dict(event), {}) == event


def test_a_logged_exception_is_kept_for_sentry_only_and_sent_masked() -> None:
    secrets = planted()  # made at run time: the event's source context lines cannot hold them

    def fail(card: str) -> None:
        raise ValueError(f"{secrets.url} refused {card}")

    try:
        try:
            fail(secrets.card_spaces)
        except ValueError as exc:
            raise LookupError(f"lookup with {secrets.bearer} failed") from exc
    except LookupError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "call failed", (), sys.exc_info())
    assert RedactingFilter().filter(record)
    # Every text handler sees the masked one-line form only, even one that prints every attribute.
    assert record.exc_info is None and secrets.leaks(repr(vars(record))) == []
    event = restore_logged_exception({"logentry": {"formatted": record.getMessage()}}, {"log_record": record})
    values = event["exception"]["values"]
    assert [v["type"] for v in values] == ["ValueError", "LookupError"]  # the cause first, as Sentry orders a chain
    assert [f["function"] for f in values[0]["stacktrace"]["frames"]][-1] == "fail"
    scrubbed = scrub_sentry_event(event, {"log_record": record})
    assert secrets.leaks(repr(scrubbed)) == [] and "'vars'" not in repr(scrubbed)
    assert [v["value"] for v in scrubbed["exception"]["values"]] == [
        f"https://deploy:{MASK}@git.example.com/app.git refused {MASK}",
        f"lookup with Authorization: {MASK} {MASK} failed",
    ]


def test_an_event_that_has_its_exception_or_no_logged_one_is_left_alone() -> None:
    own = {"exception": {"values": [{"type": "KeyError"}]}}
    assert restore_logged_exception(dict(own), {"log_record": _record("x", exc=ValueError("y"))}) == own
    assert restore_logged_exception({"message": "m"}, {}) == {"message": "m"}
