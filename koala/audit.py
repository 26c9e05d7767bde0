from __future__ import annotations

from typing import Any

from koala.models import AuditEvent


def record_audit(*, actor: str, action: str, target_type: str, target_id: object, details: dict[str, Any] | None = None) -> None:
    """Write an audit row. Call inside the transaction that makes the change it describes."""
    AuditEvent.objects.create(
        actor=actor, action=action, target_type=target_type, target_id=str(target_id), details=details or {}
    )
