"""The priced model API's client: one completion per key, with its token usage.

Configured by ``KOALA_MODELS_URL`` and ``KOALA_MODELS_API_KEY`` (a secret: give it as
``KOALA_MODELS_API_KEY_FILE`` in production), ``KOALA_MODELS_TIMEOUT_SECONDS`` and
``KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS``; its lookup honours
``KOALA_MODELS_PROCESSING_WINDOW_SECONDS``. Koala prices the usage from its own price table
(ModelPrice); the provider's idea of the price is not used.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from workers.errors import TerminalFailure
from workers.operations import Miss, Processing
from workers.providers.http import Endpoint, JsonClient


class ModelsClient:
    def __init__(self, endpoint: Endpoint) -> None:
        self.http = JsonClient(endpoint)

    def complete(self, *, key: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        return self.http.post(
            "/v1/models/complete", {"model": model, "prompt": prompt, "max_tokens": max_tokens}, idempotency_key=key
        )

    def lookup(self, key: str) -> dict[str, Any] | Miss | Processing | None:
        """The completion made under ``key`` / Miss / Processing / None (JsonClient.lookup)."""
        return self.http.lookup("/v1/completions", key=key)


def client() -> ModelsClient:
    if not settings.KOALA_MODELS_URL:
        raise TerminalFailure("KOALA_MODELS_URL is not set: this worker cannot reach the model API", code="not_configured")
    return ModelsClient(
        Endpoint(
            name="models",
            base_url=settings.KOALA_MODELS_URL,
            api_key=settings.KOALA_MODELS_API_KEY,
            timeout=settings.KOALA_MODELS_TIMEOUT_SECONDS,
            connect_timeout=settings.KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS,
            processing_window=settings.KOALA_MODELS_PROCESSING_WINDOW_SECONDS,
        )
    )
