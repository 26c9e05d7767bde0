"""Fixtures for the side-effect tests: the loopback provider, the SMTP sink, settings that point
Koala's clients at them (in this process and in worker subprocesses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.sandbox.provider import FakeProvider
from tests.conftest import worker_env
from tests.fakes.smtp import SmtpSink

PROVIDER_API_KEY = "sk_test_fakeproviderkey0123456789"  # a credential-shaped value: it must never be stored


@pytest.fixture
def provider(tmp_path: Path, settings) -> Iterator[FakeProvider]:  # type: ignore[no-untyped-def]
    """A running provider; Koala's payment and model clients in this process point at it."""
    fake = FakeProvider(tmp_path / "provider.jsonl", api_key=PROVIDER_API_KEY).start()
    settings.KOALA_PAYMENTS_URL = fake.url
    settings.KOALA_PAYMENTS_API_KEY = PROVIDER_API_KEY
    settings.KOALA_MODELS_URL = fake.url
    settings.KOALA_MODELS_API_KEY = PROVIDER_API_KEY
    settings.KOALA_PAYMENTS_TIMEOUT_SECONDS = 2.0
    settings.KOALA_MODELS_TIMEOUT_SECONDS = 2.0
    # The fake records an effect before it answers, so its lookups are consistent at once
    # (a processing window of 0); tests of its "processing" fault declare their own window.
    settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS = 0.0
    settings.KOALA_MODELS_PROCESSING_WINDOW_SECONDS = 0.0
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def smtp_sink(tmp_path: Path, settings) -> Iterator[SmtpSink]:  # type: ignore[no-untyped-def]
    """A running SMTP server; Django's default mailer in this process sends to it."""
    sink = SmtpSink(tmp_path / "mail.jsonl").start()
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": sink.host, "port": sink.port, "timeout": 2.0},
        }
    }
    try:
        yield sink
    finally:
        sink.stop()


def effects_env(provider: FakeProvider | None = None, smtp: SmtpSink | None = None, **extra: str) -> dict[str, str]:
    """Environment for a worker subprocess that serves the side-effect kinds against the fakes."""
    values = {"KOALA_JOB_KIND_MODULES": "workers.builtin_kinds,effects.kinds,tests.kinds"}
    if provider is not None:
        values |= {
            "KOALA_PAYMENTS_URL": provider.url,
            "KOALA_PAYMENTS_API_KEY": PROVIDER_API_KEY,
            "KOALA_MODELS_URL": provider.url,
            "KOALA_MODELS_API_KEY": PROVIDER_API_KEY,
            # See the provider fixture: the fake's lookups are consistent at once.
            "KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS": "0",
            "KOALA_MODELS_PROCESSING_WINDOW_SECONDS": "0",
        }
    if smtp is not None:
        values |= {"EMAIL_HOST": smtp.host, "EMAIL_PORT": str(smtp.port), "EMAIL_TIMEOUT": "10"}
    return worker_env(**(values | extra))
