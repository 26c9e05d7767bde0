"""Reading exports for people: the newest export records, redacted, with what the viewer may do.

Only records are shown (scope, state, counts, checksum, timings, the failure), never customer
rows. Who may download or cancel an export is decided by ``exports.selectors.export_access``
(the rules of ``open_download`` and ``cancel_export``); the console only asks. A person's read of the list
is written to the audit log, like the job list.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from exports.selectors import Person, describe_export, export_access, latest_exports
from koala.audit import AuditAction, record_audit
from koala.redaction import redact_data

LIST_LIMIT = 50  # the newest exports; older ones are in the Django admin's export list
CHECKSUM_PREFIX = 12


@dataclass(frozen=True)
class ExportRow:
    record: dict[str, Any]  # describe_export(), every string passed through the redaction layer
    checksum_prefix: str
    created_at: dt.datetime
    finished_at: dt.datetime | None
    ended: bool  # succeeded, failed or cancelled: never changes again
    may_download: bool
    may_cancel: bool


def list_exports(*, user: Person, actor: str, limit: int = LIST_LIMIT) -> list[ExportRow]:
    """The newest exports (an export whose job the engine ended shown settled, see
    ``exports.selectors``), redacted, newest first."""
    exports = latest_exports(limit=limit)
    access = export_access(user=user, exports=exports)
    rows = []
    for export in exports:
        record = redact_data(describe_export(export=export))
        rows.append(
            ExportRow(
                record=record,
                checksum_prefix=str(record["sha256"] or "")[:CHECKSUM_PREFIX],
                created_at=export.created_at,
                finished_at=export.finished_at,
                ended=export.is_terminal,
                may_download=access[export.pk].may_download,
                may_cancel=access[export.pk].may_cancel,
            )
        )
    with transaction.atomic():
        record_audit(actor=actor, action=AuditAction.READ, target_type="export_list", target_id="", details={"shown": len(rows)})
    return rows
