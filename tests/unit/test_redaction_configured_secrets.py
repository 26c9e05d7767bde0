"""The process's configured secrets (SECRET_KEY, the provider keys, the database and SMTP
passwords, Sentry's DSN, the OTLP headers) are masked in every text, with no attempt or request
context: a body that raises with a provider key in its message stores and logs none of it.
(tests/acceptance/test_container_secrets.py shows it end to end, the secrets read from files.)"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any
from urllib.parse import quote_plus

import pytest
from django.test import override_settings

from koala.redaction import MASK, RedactingFilter, redact_text


def test_each_configured_secret_is_masked_in_free_text_in_any_of_its_spellings(settings: Any) -> None:
    key, password, smtp = (secrets.token_urlsafe(24) + "+/=" for _ in range(3))
    mailers = {"default": {"BACKEND": "x", "OPTIONS": {"password": smtp}}}
    databases = {"default": {**settings.DATABASES["default"], "PASSWORD": password}}
    with override_settings(KOALA_PAYMENTS_API_KEY=key, DATABASES=databases, MAILERS=mailers):
        for value in (key, password, smtp):
            said = redact_text(f"refused {value} (as JSON {json.dumps(value)}, in a form {quote_plus(value)})")
            assert said == f'refused {MASK} (as JSON "{MASK}", in a form {MASK})', said


def test_a_log_record_with_a_configured_key_is_masked_outside_any_attempt(settings: Any) -> None:
    key = "pk_" + secrets.token_hex(16)
    with override_settings(KOALA_MODELS_API_KEY=key, SECRET_KEY="s" + secrets.token_urlsafe(50)):
        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "calling with %s and %s", (key, settings.SECRET_KEY), None)
        RedactingFilter().filter(record)
        assert record.getMessage() == f"calling with {MASK} and {MASK}"


@pytest.mark.parametrize("short", ["", "koala", "123456789"])
def test_a_short_or_empty_configured_value_masks_nothing(short: str) -> None:
    """An unset key is "", and a short one would mask ordinary words."""
    with override_settings(KOALA_PAYMENTS_API_KEY=short):
        assert redact_text("koala 123456789 ok") == "koala 123456789 ok"
