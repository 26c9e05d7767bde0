"""The payment provider's client: create an order, charge it, look either up by key.

Configured by ``KOALA_PAYMENTS_URL`` and ``KOALA_PAYMENTS_API_KEY`` (a secret: give it as
``KOALA_PAYMENTS_API_KEY_FILE`` in production), ``KOALA_PAYMENTS_TIMEOUT_SECONDS`` and
``KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS``; its lookup honours
``KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS``. Errors follow effects.providers.http.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from effects.providers.http import Endpoint, JsonClient
from workers import Miss, Processing, TerminalFailure


class PaymentsClient:
    def __init__(self, endpoint: Endpoint) -> None:
        self.http = JsonClient(endpoint)

    def create_order(
        self, *, key: str, reference: str, amount_minor: int, currency: str, description: str = ""
    ) -> dict[str, Any]:
        body = {"reference": reference, "amount_minor": amount_minor, "currency": currency, "description": description}
        return self.http.post("/v1/orders", body, idempotency_key=key)

    def charge(self, *, key: str, order: str, amount_minor: int, currency: str, description: str = "") -> dict[str, Any]:
        body = {"order": order, "amount_minor": amount_minor, "currency": currency, "description": description}
        return self.http.post("/v1/charges", body, idempotency_key=key)

    def lookup_order(self, key: str) -> dict[str, Any] | Miss | Processing | None:
        """The order created under ``key`` / Miss / Processing / None (JsonClient.lookup)."""
        return self.http.lookup("/v1/orders", key=key)

    def lookup_charge(self, key: str) -> dict[str, Any] | Miss | Processing | None:
        """The charge created under ``key`` / Miss / Processing / None (JsonClient.lookup)."""
        return self.http.lookup("/v1/charges", key=key)


def client() -> PaymentsClient:
    """The configured client; a job reaching a payment without configuration fails visibly."""
    if not settings.KOALA_PAYMENTS_URL:
        raise TerminalFailure(
            "KOALA_PAYMENTS_URL is not set: this worker cannot reach the payment provider", code="not_configured"
        )
    return PaymentsClient(
        Endpoint(
            name="payments",
            base_url=settings.KOALA_PAYMENTS_URL,
            api_key=settings.KOALA_PAYMENTS_API_KEY,
            timeout=settings.KOALA_PAYMENTS_TIMEOUT_SECONDS,
            connect_timeout=settings.KOALA_PROVIDER_CONNECT_TIMEOUT_SECONDS,
            processing_window=settings.KOALA_PAYMENTS_PROCESSING_WINDOW_SECONDS,
        )
    )
