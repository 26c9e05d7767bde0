from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any
from urllib.parse import quote_plus

from koala.redaction import (
    FRAGMENT_WINDOW,
    MASK,
    RedactingFilter,
    Redactor,
    bind,
    current,
    extend,
    redact_data,
    redact_text,
    scrub_sentry_breadcrumb,
    scrub_sentry_event,
    sensitive_values,
)
from tests.planted import Planted, planted

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
        "breadcrumbs": {"values": [{"message": "GET ?api_key=qqqqqqqqqqqq", "data": {"password": "hunter2hunter2"}}]},
        "request": {"headers": {"Authorization": "Bearer x", "X-Api-Key": "k"}, "cookies": {"sessionid": "s3ss10nvalue"}},
    }
    scrubbed = scrub_sentry_event(event, {})
    flat = repr(scrubbed)
    for leaked in ("abcdefghijklmnopq", "letmeinletmein", "qqqqqqqqqqqq", "hunter2hunter2", "s3ss10nvalue", "'vars'"):
        assert leaked not in flat, leaked


def test_card_numbers_grouped_by_plus_or_encoded_spaces_are_masked() -> None:
    secrets = planted()
    for written in (secrets.card, secrets.card_spaces, secrets.card_dashes, secrets.card_plus, secrets.card_pct):
        out = redact_text(f"/pay?card={written}&page=2")
        assert secrets.card[-4:] not in out, (written, out)
        assert "page=2" in out
    # Numbers that fail the Luhn check stay (order numbers, timestamps).
    assert redact_text("order 1234+5678+9012+3456") == "order 1234+5678+9012+3456"


def test_a_password_inside_an_encoded_url_is_masked() -> None:
    secrets = planted()
    from urllib.parse import quote

    for written in (secrets.url, quote(secrets.url, safe=""), quote(secrets.url, safe=":/@")):
        assert secrets.url_password not in redact_text(f"clone {written} failed"), written


def test_a_long_declared_value_is_masked_by_any_fragment_of_a_window_or_more() -> None:
    secrets = planted()
    redactor = Redactor.of(
        {"dossier": secrets.document, "pin": secrets.declared, "prompt": secrets.prompt}, sensitive={"dossier", "pin"}
    )
    middle = len(secrets.document) // 2
    for fragment in (
        secrets.document[:100],
        secrets.document[middle : middle + 30],
        secrets.document[-FRAGMENT_WINDOW:],
        secrets.document[7 : 7 + FRAGMENT_WINDOW],
    ):
        out = redactor.text(f"the model said: '{fragment}' (retry later)")
        assert fragment not in out and MASK in out, fragment
        assert out.startswith("the model said: '") and out.endswith("' (retry later)"), out
    assert secrets.leaks(redactor.text(secrets.quote())) == []
    # In data too, under any key, and JSON- or URL-escaped.
    assert secrets.leaks(json.dumps(redactor.data({"memo": secrets.quote(), "list": [secrets.document[5:60]]}))) == []
    assert secrets.leaks(redactor.text(quote_plus(secrets.quote()))) == []


def test_fragment_masking_leaves_ordinary_text_alone() -> None:
    prompt = "Please summarise the following quarterly report for the board. " + "-" * 40 + " " * 30 + "0" * 25
    redactor = Redactor.of({"prompt": prompt, "pin": "k9x2"}, sensitive={"pin"})
    # Sharing fewer characters in a row than a window, or a window without enough distinct
    # characters: not distinctive.
    for text in (
        "Please summarise a report",
        "a separator " + "-" * 40 + " and spaces" + " " * 30 + "and zeros " + "0" * 25,
        "following quarterly",
    ):
        assert redactor.text(text) == text, text
    # A short declared value is masked only literally; its pieces are ordinary text.
    assert redactor.text("pin k9x2 then k9 and x2") == f"pin {MASK} then k9 and x2"
    # A window of the prompt is distinctive: masked.
    assert MASK in redactor.text("he wrote: summarise the following quarterly")


def test_redact_data_masks_values_of_its_own_sensitive_keys_repeated_elsewhere() -> None:
    data = {"pin": "zz81kq", "memo": "customer pin is zz81kq", "nested": {"prompt": "x" * 3 + "tell me about Q3 revenue", "n": 1}}
    out = redact_data(data, sensitive={"pin"})
    assert out["pin"] == MASK and out["memo"] == f"customer pin is {MASK}"
    assert out["nested"] == {"prompt": MASK, "n": 1}


def test_the_bound_context_masks_in_every_module_level_call_and_the_log_filter() -> None:
    secrets = planted()
    job = Redactor.of({"pin": secrets.declared, "prompt": secrets.prompt}, sensitive={"pin"})
    message = f"refused {secrets.declared}: {secrets.prompt[:100]}"
    assert secrets.leaks(redact_text(message)) != []  # nothing bound: only patterns
    with bind(job):
        assert current() is not None and secrets.leaks(redact_text(message)) == []
        assert secrets.leaks(json.dumps(redact_data({"memo": message}))) == []
        record = logging.LogRecord("t", logging.WARNING, __file__, 1, "refused %s", (message,), None)
        assert RedactingFilter().filter(record)
        assert secrets.leaks(logging.Formatter().format(record)) == []
        with bind(Redactor(values=("another-secret-value",))):
            # Nested: both are known inside, the inner one only until its block ends.
            assert redact_text(f"{secrets.declared} another-secret-value") == f"{MASK} {MASK}"
        assert redact_text("another-secret-value") == "another-secret-value"
        extend(Redactor(values=("joined-for-the-rest",)))
        assert redact_text("joined-for-the-rest") == MASK
    assert redact_text("joined-for-the-rest") == "joined-for-the-rest"  # extend ends with its bind
    assert secrets.leaks(redact_text(message)) != []


def _sdk_like_event(s: Planted) -> dict[str, Any]:
    """An event shaped as sentry_sdk hands it to before_send (serialized) from a Django request."""
    query = (
        f"token={s.bearer_token}&key={s.project_key}&aws={s.aws_key}&jwt={s.jwt}&card={s.card_plus}"
        f"&card2={s.card_pct}&repo={quote_plus(s.url)}&page=2"
    )
    return {
        "level": "error",
        "message": f"failed for {s.declared}",
        "logentry": {"message": "failed %s", "formatted": f"failed {s.quote()}", "params": [s.quote()]},
        "exception": {
            "values": [
                {
                    "type": "RuntimeError",
                    "value": f"boom {s.free_text()} {s.quote()}",
                    "stacktrace": {"frames": [{"function": "boom", "lineno": 12, "vars": {"request": "<WSGIRequest>"}}]},
                }
            ]
        },
        "breadcrumbs": {
            "values": [
                {
                    "type": "log",
                    "message": f"handling {query}",
                    "data": {"memo": s.quote(), "url": f"https://api.example.com/v1?{query}"},
                    "timestamp": "2026-01-01T00:00:00Z",
                }
            ]
        },
        "extra": {
            "request": f"<WSGIRequest: GET '/_test/boom/?{query}'>",
            "status_code": 500,
            "sys.argv": ["manage.py", "runserver"],
        },
        "request": {
            "url": f"http://127.0.0.1:8000/_test/boom/?{query}",
            "method": "POST",
            "query_string": query,
            "headers": {
                "Authorization": f"Bearer {s.bearer_token}",
                "X-Debug": f"{s.project_key} {s.card_spaces}",
                "Referer": s.url,
                "Cookie": f"tracking={s.jwt}",
            },
            "cookies": {"tracking": s.jwt, "sessionid": "plainsessionvalue123"},
            "data": {"memo": s.quote(), "password": "form-password-9", "card": s.card_spaces, "decision": "approve"},
            "env": {"SERVER_NAME": "localhost"},
        },
        "contexts": {"trace": {"trace_id": "a" * 32, "span_id": "b" * 16}},
    }


def test_sentry_before_send_scrubs_every_part_of_a_request_event() -> None:
    secrets = planted()
    job = Redactor.of(secrets.job_input(), sensitive={"pin", "dossier"})
    with bind(job):
        scrubbed = scrub_sentry_event(_sdk_like_event(secrets), {})
    flat = json.dumps(scrubbed)
    assert secrets.leaks(flat) == [], secrets.leaks(flat)
    for leaked in ("form-password-9", "plainsessionvalue123", '"vars"', '"params"'):
        assert leaked not in flat, leaked
    # Masked, not emptied: what is not secret still helps whoever reads the event.
    request = scrubbed["request"]
    assert "page=2" in request["query_string"] and f"token={MASK}" in request["query_string"]
    assert request["data"]["decision"] == "approve" and request["data"]["password"] == MASK
    assert request["cookies"] == {"tracking": MASK, "sessionid": MASK}
    assert request["headers"]["Authorization"] == MASK and request["method"] == "POST"
    assert scrubbed["exception"]["values"][0]["stacktrace"]["frames"][0]["lineno"] == 12
    assert scrubbed["contexts"]["trace"]["trace_id"] == "a" * 32


def test_sentry_before_breadcrumb_masks_with_the_bound_context() -> None:
    secrets = planted()
    crumb = {
        "type": "log",
        "category": "tests.leaky",
        "message": f"quoting {secrets.quote()}",
        "timestamp": dt.datetime.now(dt.UTC),
        "data": {"excerpt": secrets.document[200:260], "url": f"https://x.example/?jwt={secrets.jwt}", "n": 3},
    }
    with bind(Redactor.of(secrets.job_input(), sensitive={"pin", "dossier"})):
        scrubbed = scrub_sentry_breadcrumb(crumb, {})
    assert secrets.leaks(json.dumps(scrubbed, default=str)) == []
    assert isinstance(scrubbed["timestamp"], dt.datetime) and scrubbed["data"]["n"] == 3
