"""Audit actions are one typed vocabulary (``koala.audit.AuditAction``), not free-form strings.

Static checks, no database: every ``record_audit`` call in shipped code names its action as a
member of the enum (never a literal or an f-string); the enum keeps every value already stored
(rows written before it existed still read as the same action); the audit row's column offers
exactly its choices; and ``record_audit`` refuses anything else before it writes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from koala.audit import AuditAction, record_audit
from koala.models import AuditEvent

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("koala", "workers", "effects", "reviews", "exports", "console", "api", "devtools", "schedules", "metrics")

# The values audit rows carry since before the enum: stored rows, docs and dashboards name them.
STORED_BEFORE_THE_ENUM = {
    "read",
    "enqueue",
    "cancel",
    "retry",
    "requeue",
    "bulk_cancel",
    "bulk_retry",
    "bulk_requeue",
    "pause",
    "resume",
    "budget.create",
    "budget.update",
    "price.set",
    "operation.resolve",
    "review.requested",
    "review.superseded",
    "review.approve",
    "review.reject",
    "review.expired",
    "review.withdrawn",
    "export.request",
    "export.cancel",
    "export.download",
    "export.grant_access",
}


def audit_calls() -> list[tuple[str, ast.Call]]:
    found = []
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "record_audit":
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def test_every_audit_call_names_a_member_of_the_enum() -> None:
    calls = audit_calls()
    assert len(calls) >= 20, "the scan found the audit calls"
    wrong = []
    for where, call in calls:
        action = next((k.value for k in call.keywords if k.arg == "action"), None)
        named = isinstance(action, ast.Attribute) and isinstance(action.value, ast.Name) and action.value.id == "AuditAction"
        # A name bound to a member elsewhere (the console's bulk actions map theirs) is typed by mypy.
        if not named and not isinstance(action, ast.Name | ast.Subscript):
            wrong.append(f"{where}: {ast.unparse(action) if action else 'no action='}")
    assert wrong == [], "record_audit(action=…) takes an AuditAction member, never a literal"


def test_the_enum_keeps_every_stored_value_and_the_column_offers_exactly_it() -> None:
    assert STORED_BEFORE_THE_ENUM <= set(AuditAction.values)
    field = AuditEvent._meta.get_field("action")
    assert field.choices == AuditAction.choices
    assert max(len(v) for v in AuditAction.values) <= field.max_length  # type: ignore[operator]


@pytest.mark.parametrize("action", ["read_job", "Read", "", "export.downloaded"])
def test_record_audit_refuses_an_action_outside_the_enum(action: str) -> None:
    with pytest.raises(ValueError, match="not an audit action"):
        record_audit(actor="x", action=action, target_type="job", target_id=1)  # type: ignore[arg-type]
