"""A job kind for tests/acceptance/test_container_secrets.py: its body logs and raises with the
process's configured secrets in the text, as a careless body or a library's error message would.
Loaded through KOALA_JOB_KIND_MODULES by that test only."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings

from workers import JobContext, job_kind

logger = logging.getLogger("tests.leak_kinds")


@job_kind("test.secret_leak", version=1, queue="default", max_attempts=1)
def secret_leak(ctx: JobContext, data: dict[str, Any]) -> None:
    payments, models = settings.KOALA_PAYMENTS_API_KEY, settings.KOALA_MODELS_API_KEY
    logger.warning("calling the provider with key %s (models %s)", payments, models)
    raise RuntimeError(f"provider refused key {payments} (models key {models}, signing key {settings.SECRET_KEY})")
