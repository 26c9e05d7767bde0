"""Export services: the only code that creates, cancels, settles or hands out exports.

Views and commands parse input and call these (reads are ``exports.selectors``). Every change
writes its audit row in the same transaction; a person's download is audited too (a read of
customer data).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import IO

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from exports.errors import ExportError, ExportNotFound, ExportNotReady, ExportObjectMissing, ExportPermissionDenied
from exports.models import EXPORT_TERMINAL_STATES, Account, Export, ExportFormat, ExportState
from exports.selectors import Person, can_access_account, get_export
from exports.selectors import username as _username
from exports.storage import ExportStore, ObjectMissing, output_key_for
from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from workers import sql
from workers.errors import JobStateError
from workers.models import Job
from workers.services.jobs import cancel_job, enqueue

log = logging.getLogger("koala.exports")

EXPORT_KIND = "export.csv"


@dataclass(frozen=True)
class Limits:
    max_rows: int
    max_bytes: int
    time_limit_seconds: float


@dataclass(frozen=True)
class Download:
    filename: str
    handle: IO[bytes]
    size: int
    checksum: str


def job_key_for(export_id: int) -> str:
    """The export job's idempotency key: one job per export, and the prefix of its operation keys."""
    return f"export-{export_id}"


def grant_account_access(*, account_id: int, username: str, actor: str) -> Account:
    """Make a user a member of an account (may request and download its exports)."""
    account = Account.objects.filter(pk=account_id).first()
    if account is None:
        raise ExportNotFound(f"account {account_id} does not exist.")
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ExportNotFound(f"user {username!r} does not exist.")
    with transaction.atomic():
        account.members.add(user)
        record_audit(
            actor=actor,
            action=AuditAction.EXPORT_GRANT_ACCESS,
            target_type="account",
            target_id=account.slug,
            details={"user": username},
        )
    return account


def check_scope(*, date_from: date, date_to: date, format: str) -> None:
    """The parts of a request that do not depend on who asks: format and date range."""
    if format not in ExportFormat.values:
        raise ExportError(f"unsupported export format {format!r}; supported: {', '.join(ExportFormat.values)}.")
    if date_to < date_from:
        raise ExportError(f"the date range ends ({date_to}) before it starts ({date_from}).")
    days = (date_to - date_from).days + 1
    if days > settings.KOALA_EXPORT_MAX_DAYS:
        raise ExportError(
            f"the date range spans {days} days; the limit is {settings.KOALA_EXPORT_MAX_DAYS} days (KOALA_EXPORT_MAX_DAYS)."
        )


def resolve_limits(*, max_rows: int | None, max_bytes: int | None, time_limit_seconds: float | None) -> Limits:
    """The request's limits, defaulting to and bounded by the KOALA_EXPORT_MAX_* caps."""
    caps = Limits(settings.KOALA_EXPORT_MAX_ROWS, settings.KOALA_EXPORT_MAX_BYTES, settings.KOALA_EXPORT_MAX_SECONDS)
    chosen = Limits(
        max_rows if max_rows is not None else caps.max_rows,
        max_bytes if max_bytes is not None else caps.max_bytes,
        time_limit_seconds if time_limit_seconds is not None else caps.time_limit_seconds,
    )
    for name, value, cap in (
        ("max_rows", chosen.max_rows, caps.max_rows),
        ("max_bytes", chosen.max_bytes, caps.max_bytes),
        ("time_limit_seconds", chosen.time_limit_seconds, caps.time_limit_seconds),
    ):
        # NaN passes every comparison below (and PostgreSQL's CHECK, where NaN > 0): test it first.
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ExportError(f"{name} must be positive and finite.")
        if value > cap:
            raise ExportError(f"{name}={value:g} is beyond the limit of {cap:g}.")
    return chosen


def request_export(
    *,
    user: Person,
    account_id: int,
    date_from: date,
    date_to: date,
    format: str = ExportFormat.CSV,
    max_rows: int | None = None,
    max_bytes: int | None = None,
    time_limit_seconds: float | None = None,
) -> Export:
    """Create an export and its job (one transaction). The job's input is the export id alone."""
    account = Account.objects.filter(pk=account_id).first()
    if account is None:
        raise ExportNotFound(f"account {account_id} does not exist.")
    if not can_access_account(user=user, account=account):
        # Said before anything about the scope, so a refusal tells an outsider nothing more.
        raise ExportPermissionDenied(f"{_username(user)} may not export data of account {account.slug}.")
    check_scope(date_from=date_from, date_to=date_to, format=format)
    limits = resolve_limits(max_rows=max_rows, max_bytes=max_bytes, time_limit_seconds=time_limit_seconds)
    actor = _username(user)
    with transaction.atomic():
        export = Export.objects.create(
            account=account,
            date_from=date_from,
            date_to=date_to,
            format=format,
            requested_by=user if user.is_authenticated else None,
            requested_by_name=actor,
            max_rows=limits.max_rows,
            max_bytes=limits.max_bytes,
            time_limit_seconds=limits.time_limit_seconds,
        )
        job = enqueue(kind=EXPORT_KIND, input={"export_id": export.pk}, idempotency_key=job_key_for(export.pk), created_by=actor)
        # The output key follows from the id, so every attempt aims at the same object.
        export.job_id, export.output_key = job.job_id, output_key_for(export.pk)
        Export.objects.filter(pk=export.pk).update(job_id=export.job_id, output_key=export.output_key)
        record_audit(
            actor=actor,
            action=AuditAction.EXPORT_REQUEST,
            target_type="export",
            target_id=export.pk,
            details={
                "account": account.slug,
                "date_from": str(date_from),
                "date_to": str(date_to),
                "format": format,
                "max_rows": limits.max_rows,
                "max_bytes": limits.max_bytes,
                "time_limit_seconds": limits.time_limit_seconds,
                "job": job.job_id,
            },
        )
    return export


def cancel_export(*, export_id: int, user: Person, reason: str = "") -> Export:
    """Cancel a queued or running export and its job together. A running body stops at its next
    batch boundary after the heartbeat tells it; nothing it wrote is published."""
    actor = _username(user)
    reason = redact_text(reason)  # free text from a person: never store a pasted secret
    with transaction.atomic():
        # Store an outcome the engine already decided first (the job failed or was cancelled
        # alone): that export is ended, and cancelling it must say so, not overwrite it.
        settle_exports(export_ids=[export_id])
        export = get_export(export_id=export_id, user=user)
        if export.job_id is not None:
            # Lock order: the job row, then the export row. The export job's fenced writes
            # (publish, completion) hold the job row while they write the export; locking the
            # export first here and the job second (in cancel_job) could deadlock with them.
            Job.objects.select_for_update().filter(pk=export.job_id).values_list("pk", flat=True).first()
        locked = Export.objects.select_for_update().get(pk=export.pk)
        if locked.is_terminal:
            raise ExportError(f"export {export_id} is already {locked.state}; terminal states never change.")
        if locked.job_id is not None:
            try:
                cancel_job(job_id=locked.job_id, actor=actor, reason=reason or f"export {export_id} cancelled")
            except JobStateError:
                pass  # the job ended meanwhile (its outcome is settled into the export below)
        Export.objects.filter(pk=locked.pk, state__in=[ExportState.QUEUED, ExportState.RUNNING]).update(
            state=ExportState.CANCELLED, failure_code="", error_message=reason[:500], finished_at=timezone.now()
        )
        record_audit(
            actor=actor,
            action=AuditAction.EXPORT_CANCEL,
            target_type="export",
            target_id=export_id,
            details={"reason": reason[:200]},
        )
    settle_exports(export_ids=[export_id])
    return Export.objects.get(pk=export_id)


def open_download(*, export_id: int, user: Person) -> Download:
    """The published object of a succeeded export, for a user allowed to see its account."""
    export = get_export(export_id=export_id, user=user)
    if export.state != ExportState.SUCCEEDED:
        raise ExportNotReady(f"export {export_id} is {export.state}; only a succeeded export can be downloaded.")
    try:
        handle = ExportStore().open_final(export.output_key)
    except ObjectMissing:
        log.error("export %s succeeded, but its object %s is missing from storage", export_id, export.output_key)
        raise ExportObjectMissing(
            f"export {export_id} succeeded on {export.finished_at:%Y-%m-%d}, but its file is no longer in storage "
            "(removed or expired); request a new export of the same range."
        ) from None
    record_audit(
        actor=_username(user),
        action=AuditAction.EXPORT_DOWNLOAD,
        target_type="export",
        target_id=export_id,
        details={"account": export.account.slug, "bytes": export.bytes, "sha256": export.checksum},
    )
    return Download(
        filename=f"{export.account.slug}-{export.date_from}-{export.date_to}-export-{export.pk}.csv",
        handle=handle,
        size=export.bytes or 0,
        checksum=export.checksum,
    )


def settle_exports(*, export_ids: list[int] | None = None) -> int:
    """Copy outcomes the engine decided on its own (attempts exhausted, orphaned, a job cancelled
    with koala_cancel) into their exports. One conditional UPDATE; safe to run anywhere, any time."""
    with connection.cursor() as cursor:
        if export_ids is None:
            cursor.execute(sql.SETTLE_EXPORTS)
        else:
            cursor.execute(sql.SETTLE_EXPORTS_BY_ID, {"ids": export_ids})
        return cursor.rowcount


def remove_stale_temp_objects(*, export_ids: list[int] | None = None) -> int:
    """Delete temporary objects of exports that have ended (a killed attempt of a cancelled or
    failed export leaves its temporary file behind; running exports clean their own)."""
    settle_exports(export_ids=export_ids)
    store = ExportStore()
    removed = 0
    ended = Export.objects.filter(state__in=EXPORT_TERMINAL_STATES)
    if export_ids is not None:
        ended = ended.filter(pk__in=export_ids)
    for export_id in ended.values_list("pk", flat=True).iterator():
        for key in store.temp_keys(export_id):
            store.delete(key)
            removed += 1
    return removed


def housekeeping(*, clean_temp: bool = True, since: timedelta = timedelta(hours=1)) -> tuple[int, int]:
    """The beat's share of exports: settle engine-decided outcomes, and remove temporary objects
    of exports that ended recently (older ones were cleaned when they ended)."""
    settled = settle_exports()
    removed = 0
    if clean_temp:
        recent = list(
            Export.objects.filter(state__in=EXPORT_TERMINAL_STATES, finished_at__gte=timezone.now() - since).values_list(
                "pk", flat=True
            )
        )
        if recent:
            removed = remove_stale_temp_objects(export_ids=recent)
    return settled, removed


# -- retention (workers.hooks.register_retention) ---------------------------------------------


def keep_jobs_of_unsettled_exports(job_ids: Sequence[int], cutoff: datetime) -> set[int]:
    """A finished job whose export the beat has not settled yet stays: settling reads the job."""
    return set(
        Export.objects.filter(job_id__in=list(job_ids)).exclude(state__in=EXPORT_TERMINAL_STATES).values_list("job_id", flat=True)
    )


def forget_jobs_of_exports(job_ids: Sequence[int]) -> int:
    """Inside a prune batch's transaction: a settled export outlives its job (on_delete SET_NULL):
    its record, file and download stay; only the link to the job goes."""
    return Export.objects.filter(job_id__in=list(job_ids)).update(job=None)
