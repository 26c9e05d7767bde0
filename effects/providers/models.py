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

from effects.providers.http import Endpoint, JsonClient
from workers import Miss, Processing, TerminalFailure

MAX_OUTPUT_TOKENS = 4096  # the most any request may ask for: the output half of a call's bound


class ModelsClient:
    """The billing contract a model API must meet (Koala's spend caps rest on it): the usage
    billed for one call is at most one input token per UTF-8 byte of the prompt (true of every
    byte-level tokenizer: it merges bytes, never splits one) and at most ``max_tokens`` output
    tokens, and the same usage is reported by the completion and by its lookup. Every request
    names ``max_tokens`` (1..MAX_OUTPUT_TOKENS), so no call runs without an output bound. A bill
    beyond this is recorded as an overshoot and pauses the budget's scope (docs/safety.md)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.http = JsonClient(endpoint)

    def complete(self, *, key: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_OUTPUT_TOKENS:
            # Never send a request without the output bound its reservation was priced on.
            raise ValueError(f"max_tokens must be an integer from 1 to {MAX_OUTPUT_TOKENS}, not {max_tokens!r}")
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
