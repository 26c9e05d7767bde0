"""Passwords inside URLs (``scheme://[user]:password@host``), in every sink that shows text.

A connection URL is how a database, Redis or broker password usually travels: in a setting
(``REDIS_URL=redis://:pw@cache``), in a driver's error message, in a job's input. The user name
is optional (Redis has none by default), the password may hold ``@`` and ``:``; the user name
and the host stay readable, the password never is.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest

from koala.redaction import MASK, RedactingFilter, Redactor, redact_data, redact_text, scrub_sentry_event

PASSWORD = "Hunter2xyzzy"

URLS = [
    # (as written, as shown)
    (f"redis://:{PASSWORD}@cache:6379/0", f"redis://:{MASK}@cache:6379/0"),
    (f"rediss://:{PASSWORD}@cache.example.com:6380", f"rediss://:{MASK}@cache.example.com:6380"),
    (f"postgres://:{PASSWORD}@db/koala", f"postgres://:{MASK}@db/koala"),
    (f"postgres://app:{PASSWORD}@db:5432/koala", f"postgres://app:{MASK}@db:5432/koala"),
    (f"amqp://u:{PASSWORD}@broker", f"amqp://u:{MASK}@broker"),
    (f"mongodb+srv://svc:{PASSWORD}@cluster0.example.net/app", f"mongodb+srv://svc:{MASK}@cluster0.example.net/app"),
    (f"REDIS://:{PASSWORD}@CACHE", f"REDIS://:{MASK}@CACHE"),
    # A password holding "@" or ":" (written raw, as people do): masked whole, up to the host.
    (f"postgres://app:p@ss{PASSWORD}@db:5432/x", f"postgres://app:{MASK}@db:5432/x"),
    (f"redis://:p@ss:{PASSWORD}@cache:6379", f"redis://:{MASK}@cache:6379"),
    (f"redis://default:{PASSWORD}:more@cache", f"redis://default:{MASK}@cache"),
    # A user name that is an address.
    (f"amqp://ops@example.com:{PASSWORD}@broker", f"amqp://ops@example.com:{MASK}@broker"),
    # A URL inside a sentence, quoted, or in JSON.
    (f"cannot reach redis://:{PASSWORD}@cache:6379/0 (timeout)", f"cannot reach redis://:{MASK}@cache:6379/0 (timeout)"),
    (f"url='redis://:{PASSWORD}@cache:6379'", f"url='redis://:{MASK}@cache:6379'"),
    (f'{{"url":"redis://:{PASSWORD}@cache","next":"a@b"}}', f'{{"url":"redis://:{MASK}@cache","next":"a@b"}}'),
]

UNCHANGED = [
    "https://example.com/users/@alice",  # an "@" in the path
    "http://localhost:8000/@alice",  # host:port, then a path with "@"
    "ssh://git@github.com:22/org/repo",  # a user, no password
    "https://user@example.com/",
    "redis://cache:6379/0",
    "https://example.com/?next=a@b",
    "mailto:bob@example.com",
    '{"url":"redis://cache","next":"a@b"}',
]


@pytest.mark.parametrize(("written", "shown"), URLS)
def test_a_password_in_a_url_is_masked_with_or_without_a_user(written: str, shown: str) -> None:
    assert redact_text(written) == shown


@pytest.mark.parametrize("text", UNCHANGED)
def test_urls_without_a_password_stay_readable(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(("written", "shown"), URLS)
def test_a_url_encoded_password_url_is_masked_too(written: str, shown: str) -> None:
    from urllib.parse import quote

    out = redact_text(f"next={quote(written, safe='')}")
    assert PASSWORD not in out and "Hunter2" not in out, out


@pytest.mark.parametrize(("written", "shown"), URLS[:6])
def test_every_sink_masks_a_password_url(written: str, shown: str) -> None:
    # Pages and command output (the |redacted filter, koala_job, the console) go through
    # redact_text and redact_data; request URLs through Redactor.url.
    assert redact_data({"settings": {"REDIS_URL": written}, "list": [written]}) == {
        "settings": {"REDIS_URL": shown},
        "list": [shown],
    }
    assert PASSWORD not in Redactor().url(f"https://koala.example/_test/?next={written}")
    # Logs: in the arguments and in the exception text.
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "connecting to %s", (written,), None)
    try:
        raise ConnectionError(f"Error 111 connecting to {written}")
    except ConnectionError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    rendered = logging.Formatter().format(record)
    assert PASSWORD not in rendered and shown in rendered, rendered
    # Sentry: an exception value, a log entry, a breadcrumb, extra data.
    event: dict[str, Any] = {
        "exception": {"values": [{"type": "ConnectionError", "value": f"Error 111 connecting to {written}"}]},
        "logentry": {"message": "connecting to %s", "formatted": f"connecting to {written}", "params": [written]},
        "breadcrumbs": {"values": [{"message": f"GET {written}", "data": {"url": written}}]},
        "extra": {"redis": written},
    }
    scrubbed = repr(scrub_sentry_event(event, {}))
    assert PASSWORD not in scrubbed and shown in scrubbed, scrubbed
