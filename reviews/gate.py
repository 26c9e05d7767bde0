"""The review gate the engine's ledger asks before a critical operation (workers.hooks.ReviewGate).

Registered in ReviewsConfig.ready: the engine never imports this app, it calls through
``workers.hooks.review_gate()``. Each method delegates to reviews.services, which owns the rules.
"""

from __future__ import annotations

from typing import Any

from reviews import services


class ReviewQueueGate:
    """workers.hooks.ReviewGate, answered by the review queue."""

    def digest(self, binding: dict[str, Any]) -> str:
        return services.action_digest(binding)

    def consume_approval(self, *, job_id: int, operation_key: str, digest: str) -> bool:
        return services.consume_approval(job_id=job_id, operation_key=operation_key, digest=digest)

    def request_review(
        self,
        *,
        job_id: int,
        operation_name: str,
        operation_key: str,
        action: str,
        digest: str,
        summary: dict[str, Any],
        amount_minor: int | None,
        currency: str,
        target: str,
        kind_version: str,
        requested_by: str,
    ) -> int:
        review = services.request_review(
            job_id=job_id,
            operation_name=operation_name,
            operation_key=operation_key,
            action=action,
            digest=digest,
            summary=summary,
            amount_minor=amount_minor,
            currency=currency,
            target=target,
            kind_version=kind_version,
            requested_by=requested_by,
        )
        return review.pk
