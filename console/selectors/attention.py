"""The needs-attention list: operations whose outcome nobody could establish automatically.

An ``uncertain`` (or crashed ``in_flight``) operation went out and no answer came back, and no reconcile hook could
tell whether the provider acted. Only a person can settle it (with the provider's id when
it happened); until then its job stays parked, so nothing is sent twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from koala.audit import AuditAction, record_audit
from workers import kinds
from workers.models import Operation
from workers.services.operations import needing_attention


@dataclass
class OpenOperation:
    operation: Operation
    params: Any
    response: Any
    error: str
    park_detail: str
    form: Any = None  # the page's resolve form for this row


def open_operations(*, actor: str, limit: int = 200) -> list[OpenOperation]:
    """Open operations of jobs parked needs_attention, oldest first, with their job in the same
    query; the read is audited."""
    rows = []
    operations = needing_attention()[:limit]
    for op in operations:
        redactor = kinds.job_redactor(op.job)
        rows.append(
            OpenOperation(
                operation=op,
                params=redactor.data(op.params),
                response=redactor.data(op.response),
                error=redactor.text(op.error_message),
                park_detail=redactor.text(op.job.park_detail),
            )
        )
    with transaction.atomic():
        record_audit(
            actor=actor, action=AuditAction.READ, target_type="operations", target_id="uncertain", details={"shown": len(rows)}
        )
    return rows
