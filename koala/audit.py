"""The audit log's one writer: ``record_audit``, with a typed action (``AuditAction``)."""

from __future__ import annotations

from typing import Any

from koala.models import AuditAction, AuditEvent

__all__ = ["AuditAction", "record_audit"]


def record_audit(
    *, actor: str, action: AuditAction, target_type: str, target_id: object, details: dict[str, Any] | None = None
) -> None:
    """Write an audit row. Call inside the transaction that makes the change it describes."""
    try:
        action = AuditAction(action)
    except ValueError:
        raise ValueError(f"{action!r} is not an audit action (koala.audit.AuditAction)") from None
    AuditEvent.objects.create(
        actor=actor, action=action, target_type=target_type, target_id=str(target_id), details=details or {}
    )
