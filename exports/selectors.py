"""Export reads: who may see an account's exports, an export a person may see, the newest
exports, and what people see of one. They write nothing (a download, a read of customer data,
is audited by ``exports.services.open_download``).

An export whose job the engine ended on its own (attempts exhausted, orphaned, a job cancelled
with ``koala_cancel``) is stored as queued or running until the beat's exports task settles it
(``exports.services.settle_exports``, every tick). A read does not wait for that, nor write it:
it shows the export as that settling will store it (``_as_settled``, the same rule as the
statement ``workers.sql.SETTLE_EXPORTS``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import F, QuerySet
from django.utils import timezone

from exports.errors import ExportNotFound, ExportPermissionDenied
from exports.models import Account, Export, ExportState
from workers.models import JobState

# Whoever asks: a signed-in user, or anonymous (refused everywhere).
Person = User | AnonymousUser

_UNSETTLED = (ExportState.QUEUED, ExportState.RUNNING)
_ENGINE_ENDED = (JobState.FAILED, JobState.CANCELLED)


def username(user: Person) -> str:
    return user.get_username() if user.is_authenticated else "anonymous"


def can_access_account(*, user: Person, account: Account) -> bool:
    """Superusers see every account; anyone else only the accounts they are a member of."""
    if not user.is_authenticated or not user.is_active:
        return False
    if getattr(user, "is_superuser", False):
        return True
    return account.members.filter(pk=user.pk).exists()


def _with_job_outcome(exports: QuerySet[Export]) -> QuerySet[Export]:
    """The exports with their account and their job's outcome columns (one join, no N+1)."""
    return exports.select_related("account").annotate(
        job_state_now=F("job__state"),
        job_failure_reason_now=F("job__failure_reason"),
        job_error_now=F("job__error_message"),
        job_finished_at_now=F("job__finished_at"),
    )


def _as_settled(export: Export) -> Export:
    """``export`` as settle_exports will store it: a queued or running export whose job failed
    or was cancelled takes the job's outcome (in memory only: never saved). Keep in step with
    workers.sql._SETTLE_EXPORTS (tests/integration/test_exports_reads.py compares the two)."""
    job_state = getattr(export, "job_state_now", None)
    if export.state in _UNSETTLED and job_state in _ENGINE_ENDED:
        export.state = job_state
        export.failure_code = (export.job_failure_reason_now or "failed") if job_state == JobState.FAILED else ""  # type: ignore[attr-defined]
        export.error_message = (export.job_error_now or "")[:500]  # type: ignore[attr-defined]
        export.finished_at = export.job_finished_at_now or timezone.now()  # type: ignore[attr-defined]
    return export


def get_export(*, export_id: int, user: Person) -> Export:
    """An export the user may see, as settled (see the module's docstring)."""
    export = _with_job_outcome(Export.objects.filter(pk=export_id)).first()
    if export is None:
        raise ExportNotFound(f"export {export_id} does not exist.")
    if not can_access_account(user=user, account=export.account):
        raise ExportPermissionDenied(f"{username(user)} may not see exports of account {export.account.slug}.")
    return _as_settled(export)


def latest_exports(*, limit: int = 20) -> list[Export]:
    """The newest exports, as settled (an operator's list: records only)."""
    return [_as_settled(e) for e in _with_job_outcome(Export.objects.order_by("-id"))[: max(limit, 1)]]


@dataclass(frozen=True)
class ExportAccess:
    """What one person may do with one export, by the rules of ``open_download`` and ``cancel_export``."""

    may_download: bool  # a succeeded export of an account the person may see
    may_cancel: bool  # a queued or running export of an account the person may see


def export_access(*, user: Person, exports: Iterable[Export]) -> dict[int, ExportAccess]:
    """Per export id, whether ``user`` may download or cancel it (for a list: the links and buttons
    it shows). ``can_access_account`` decides, once per distinct account, not once per export."""
    by_account: dict[int, bool] = {}
    access: dict[int, ExportAccess] = {}
    for export in exports:
        if export.account_id not in by_account:
            by_account[export.account_id] = can_access_account(user=user, account=export.account)
        allowed = by_account[export.account_id]
        access[export.pk] = ExportAccess(
            may_download=allowed and export.state == ExportState.SUCCEEDED,
            may_cancel=allowed and not export.is_terminal,
        )
    return access


def describe_export(*, export: Export) -> dict[str, Any]:
    """What people see of an export: no customer data, only the record."""
    return {
        "id": export.pk,
        "account": export.account.slug,
        "date_from": str(export.date_from),
        "date_to": str(export.date_to),
        "format": export.format,
        "state": export.state,
        "failure_code": export.failure_code,
        "error": export.error_message,
        "rows": export.row_count,
        "bytes": export.bytes,
        "sha256": export.checksum,
        "output_key": export.output_key,
        "attempts": export.attempts,
        "compute_seconds": export.compute_seconds,
        "db_wait_seconds": export.db_wait_seconds,
        "storage_wait_seconds": export.storage_wait_seconds,
        "job": export.job_id,
        "requested_by": export.requested_by_name,
        "created_at": export.created_at.isoformat() if export.created_at else None,
        "finished_at": export.finished_at.isoformat() if export.finished_at else None,
    }


def exportable_accounts(*, user: Person) -> list[Account]:
    """The accounts ``user`` may request exports of (``can_access_account``): every one for a
    superuser, their own for a member, none for anyone else."""
    if not user.is_authenticated or not user.is_active:
        return []
    if getattr(user, "is_superuser", False):
        return list(Account.objects.order_by("slug"))
    return list(Account.objects.filter(members=user).order_by("slug"))
