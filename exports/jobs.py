"""The ``export.csv`` job kind: one attempt of one export.

An attempt (docs/exports.md has the full story):
1. loads the export and re-checks what makes it terminal: the requester's access to the
   account, the format, the scope against today's caps;
2. streams ``COPY (SELECT …) TO STDOUT`` in batches into a new temporary object, hashing as
   it goes; between batches it stores a progress checkpoint (rows, bytes) and checks
   cancellation, the row/byte limits and the time limit;
3. seals the temporary object (fsync) and names it on the export row ("staged");
4. publishes it through the operations ledger (one ``publish`` operation per export): an
   atomic, conditional link/put of the temporary object to the key derived from the export id;
5. records the result on the export row, fenced by the attempt's lease.

A replacement attempt (after kill -9, a lost lease, a transient error) finds whatever the
earlier one left: a published object with the expected checksum is reused, a complete staged
object is published, anything else is streamed again. Temporary objects of dead attempts are
deleted. Every write to the export row names the attempt's lease, so a stale attempt can
neither publish nor complete.
"""

from __future__ import annotations

import errno
import hashlib
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from exports import sql
from exports.models import Export, ExportFormat, ExportState
from exports.services import can_access_account, job_key_for
from exports.signals import export_batch, export_phase
from exports.storage import Digest, ExportStore, ObjectExists, output_key_for, temp_key_for
from exports.streaming import Connector, CopyReader, StreamError
from koala.redaction import redact_text
from workers import (
    ABSENT,
    Declined,
    JobContext,
    NotPerformed,
    OperationResult,
    OutcomeUnknown,
    ReconcileAnswer,
    Retryable,
    TerminalFailure,
    job_kind,
)

# The output's timestamps and dates must not depend on the server's or the role's defaults.
SESSION = {"TimeZone": "UTC", "DateStyle": "ISO, YMD", "IntervalStyle": "iso_8601"}
# SQLSTATE classes that mean "the database went away or is restarting": worth a retry.
TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53", "40001", "40P01")


@dataclass(frozen=True)
class Staged:
    """A complete, synced temporary object and what it must hash to."""

    key: str
    sha256: str
    bytes: int
    rows: int

    @property
    def digest(self) -> Digest:
        return Digest(sha256=self.sha256, size=self.bytes)


def _validate(data: dict[str, Any]) -> None:
    export_id = data.get("export_id")
    if not isinstance(export_id, int) or isinstance(export_id, bool) or export_id < 1:
        raise ValueError("'export_id' must be a positive integer")


class ExportAttempt:
    def __init__(self, ctx: JobContext, export_id: int) -> None:
        self.ctx = ctx
        self.export_id = export_id
        self.store = ExportStore()
        self.started = time.monotonic()
        self.waits_before = dict(ctx.waits)
        self.own_temp: str | None = None  # written by this attempt and not yet handed to the export row
        self.connector: Connector | None = None  # the stream's connection, opening while the attempt checks and fences
        self.publish_key = f"{job_key_for(export_id)}:publish"

    # -- the attempt ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        export = self._load()
        if export.state == ExportState.SUCCEEDED:
            # Completed by an earlier attempt whose job completion was lost: the same result.
            return self._result(export.output_key, export.checksum, export.bytes or 0, export.row_count or 0)
        if export.is_terminal:
            raise TerminalFailure(f"export {export.pk} is already {export.state}", code=f"export_{export.state}")
        try:
            if not export.staged_key:  # it will stream (unless the checks below end it: then it is closed unused)
                self.connector = Connector(
                    session=SESSION,
                    statement_timeout_seconds=export.time_limit_seconds - (time.monotonic() - self.started),
                    application_name=f"koala-export-{export.pk}",
                )
            self._authorize(export)
            self._fenced(state=ExportState.RUNNING, attempts=F("attempts") + 1, started_at=Coalesce("started_at", Now()))
            staged = self._resume(export)
            resumed = staged is not None
            if staged is None:
                self._clean_temps()
                staged = self._stream(export)
                self._fenced(
                    staged_key=staged.key, staged_checksum=staged.sha256, staged_bytes=staged.bytes, staged_rows=staged.rows
                )
                self.own_temp = None  # the export row names it now: a replacement attempt may publish it
            self._phase("staged")
            self._publish(export, staged, verify=resumed)
            self._phase("published")
            self._clean_temps()
            self._complete(staged)
            self._phase("completed")
            return self._result(export.output_key or output_key_for(export.pk), staged.sha256, staged.bytes, staged.rows)
        except TerminalFailure as exc:
            self._give_up(code=exc.code, message=str(exc))
            raise
        except Retryable as exc:
            self._last_attempt_gives_up(exc)
            raise
        except (OSError, psycopg.OperationalError, OperationalError, InterfaceError) as exc:
            transient = Retryable(_describe(exc))
            self._last_attempt_gives_up(transient)
            raise transient from exc
        except StreamError as exc:
            if exc.timed_out:
                failure = TerminalFailure(
                    f"the export ran past its time limit of {export.time_limit_seconds:g}s (statement timeout)",
                    code="time_limit_exceeded",
                )
                self._give_up(code=failure.code, message=str(failure))
                raise failure from exc
            if exc.sqlstate and exc.sqlstate.startswith(TRANSIENT_SQLSTATES):
                transient = Retryable(f"the database ended the export's query: {exc}")
                self._last_attempt_gives_up(transient)
                raise transient from exc
            raise
        finally:
            if self.connector is not None:
                self.connector.close()  # unless the stream took it
            if self.own_temp is not None:
                self._quietly_delete(self.own_temp)

    # -- steps ----------------------------------------------------------------------------
    def _load(self) -> Export:
        with self.ctx.waiting("db"):
            export = Export.objects.select_related("account", "requested_by").filter(pk=self.export_id).first()
        if export is None:
            raise TerminalFailure(f"export {self.export_id} does not exist", code="export_missing")
        return export

    def _authorize(self, export: Export) -> None:
        """What no retry can fix. Checked on every attempt: access may be revoked, caps lowered."""
        if export.format not in ExportFormat.values:
            raise TerminalFailure(f"unsupported export format {export.format!r}", code="unsupported_format")
        with self.ctx.waiting("db"):
            allowed = export.requested_by is not None and can_access_account(user=export.requested_by, account=export.account)
        if not allowed:
            raise TerminalFailure(
                f"{export.requested_by_name} is not authorized for account {export.account.slug}", code="unauthorized"
            )
        days = (export.date_to - export.date_from).days + 1
        beyond = []
        if days > settings.KOALA_EXPORT_MAX_DAYS:
            beyond.append(f"{days} days > {settings.KOALA_EXPORT_MAX_DAYS}")
        if export.max_rows > settings.KOALA_EXPORT_MAX_ROWS:
            beyond.append(f"max_rows {export.max_rows} > {settings.KOALA_EXPORT_MAX_ROWS}")
        if export.max_bytes > settings.KOALA_EXPORT_MAX_BYTES:
            beyond.append(f"max_bytes {export.max_bytes} > {settings.KOALA_EXPORT_MAX_BYTES}")
        if export.time_limit_seconds > settings.KOALA_EXPORT_MAX_SECONDS:
            beyond.append(f"time limit {export.time_limit_seconds:g}s > {settings.KOALA_EXPORT_MAX_SECONDS:g}s")
        if beyond:
            raise TerminalFailure(f"the export's scope is beyond the limits: {'; '.join(beyond)}", code="scope_beyond_limits")

    def _resume(self, export: Export) -> Staged | None:
        """What an earlier attempt left that this one can finish instead of streaming again."""
        if not export.staged_key:
            return None
        staged = Staged(export.staged_key, export.staged_checksum, export.staged_bytes or 0, export.staged_rows or 0)
        with self.ctx.waiting("db"):
            op = self.ctx.previous_operation("publish", key=self.publish_key)
        if op is not None and op.is_done:
            return staged  # published and recorded; _publish returns the stored result and verifies the object
        with self.ctx.waiting("storage"):
            if self.store.digest(export.output_key) == staged.digest:
                return staged  # published, not yet recorded: the ledger's reconcile finds it
            if self.store.digest(staged.key) == staged.digest:
                return staged  # complete but not published: publish it
        return None

    def _stream(self, export: Export) -> Staged:
        remaining = export.time_limit_seconds - (time.monotonic() - self.started)
        if remaining <= 0:
            raise TerminalFailure(
                f"the export reached its time limit of {export.time_limit_seconds:g}s", code="time_limit_exceeded"
            )
        select, params = sql.select_sql(
            account_id=export.account_id, date_from=export.date_from, date_to=export.date_to, limit=export.max_rows + 1
        )
        key = temp_key_for(export.pk, self.ctx.lease.lease_token)
        hasher = hashlib.sha256()
        rows = size = batches = 0
        with self.ctx.waiting("storage"):
            out = self.store.open_temp(key)
        self.own_temp = key
        self._phase("streaming")
        try:
            with CopyReader(
                statement=sql.copy_sql(select),
                params=params,
                batch_rows=settings.KOALA_EXPORT_BATCH_ROWS,
                waiting=self.ctx.waiting,
                **self._connection(export, remaining),
            ) as reader:
                for batch in reader.batches():
                    hasher.update(batch.data)
                    with self.ctx.waiting("storage"):
                        out.write(batch.data)
                    rows += batch.rows
                    size += len(batch.data)
                    batches += 1
                    self.ctx.progress(rows=rows, bytes=size, batches=batches)
                    export_batch.send_robust(
                        sender=ExportAttempt,
                        export_id=export.pk,
                        attempt=self.ctx.attempt,
                        batch=batches,
                        rows=rows,
                        bytes=size,
                    )
                    self._check_limits(export, rows=rows, size=size)
                    if self.ctx.cancelled.is_set():  # cancelled, lease lost or a stop pause
                        self._phase("stopped")
                        self.ctx.checkpoint()  # raises with the engine's reason
            with self.ctx.waiting("storage"):
                self.store.seal(out)
        finally:
            if not out.closed:
                out.close()
        return Staged(key=key, sha256=hasher.hexdigest(), bytes=size, rows=rows)

    def _connection(self, export: Export, remaining: float) -> dict[str, Any]:
        """CopyReader's connection arguments: the connector's (opened ahead), else a new connection's."""
        if self.connector is not None:
            return {"connector": self.connector}
        return {"statement_timeout_seconds": remaining, "session": SESSION, "application_name": f"koala-export-{export.pk}"}

    def _check_limits(self, export: Export, *, rows: int, size: int) -> None:
        if rows > export.max_rows:
            raise TerminalFailure(f"the export has more than its limit of {export.max_rows} rows", code="row_limit_exceeded")
        if size > export.max_bytes:
            raise TerminalFailure(f"the export is larger than its limit of {export.max_bytes} bytes", code="byte_limit_exceeded")
        elapsed = time.monotonic() - self.started
        if elapsed > export.time_limit_seconds:
            raise TerminalFailure(
                f"the export ran {elapsed:.1f}s, past its time limit of {export.time_limit_seconds:g}s "
                f"(stopped after {rows} rows)",
                code="time_limit_exceeded",
            )

    def _publish(self, export: Export, staged: Staged, *, verify: bool) -> None:
        final = export.output_key or output_key_for(export.pk)
        result = {"key": final, "sha256": staged.sha256, "bytes": staged.bytes, "rows": staged.rows}
        performed = False

        def perform(op_key: str) -> OperationResult:
            nonlocal performed
            with self.ctx.waiting("storage"):
                try:
                    self.store.publish(staged.key, final)
                    self._phase("object_written")
                except ObjectExists:
                    if self.store.digest(final) != staged.digest:
                        raise Declined(f"{final} already holds a different object; it is never replaced") from None
                except OSError as exc:
                    # link() is all or nothing; only a failure after it leaves the object in place.
                    if self.store.exists(final):
                        raise OutcomeUnknown(f"publishing {final}: {_describe(exc)}") from None
                    raise NotPerformed(f"publishing {final}: {_describe(exc)}") from None
            performed = True
            return OperationResult(external_id=final, data=result)

        def reconcile(op_key: str) -> ReconcileAnswer:
            with self.ctx.waiting("storage"):
                found = self.store.digest(final)
            if found is None:
                return ABSENT
            if found == staged.digest:
                return OperationResult(external_id=final, data=result)
            return None  # another object under our key: a person must look

        self.ctx.operation(
            "publish",
            kind="publish",
            key=self.publish_key,
            params={"export_id": export.pk, **result},
            perform=perform,
            reconcile=reconcile,
            target=final,
        )
        if verify and not performed:
            with self.ctx.waiting("storage"):
                found = self.store.digest(final)
            if found != staged.digest:
                raise TerminalFailure(
                    f"the published object {final} does not match its recorded checksum", code="published_object_mismatch"
                )

    def _complete(self, staged: Staged) -> None:
        db = self.ctx.waits["db"] - self.waits_before["db"]
        storage = self.ctx.waits["storage"] - self.waits_before["storage"]
        elapsed = time.monotonic() - self.started
        self._fenced(
            state=ExportState.SUCCEEDED,
            checksum=staged.sha256,
            bytes=staged.bytes,
            row_count=staged.rows,
            staged_key="",
            staged_checksum="",
            staged_bytes=None,
            staged_rows=None,
            compute_seconds=max(elapsed - db - storage, 0.0),
            db_wait_seconds=db,
            storage_wait_seconds=storage,
            failure_code="",
            error_message="",
            finished_at=timezone.now(),
        )

    # -- endings ------------------------------------------------------------------------------
    def _give_up(self, *, code: str, message: str) -> None:
        """Record a terminal failure on the export and drop every temporary object."""
        try:
            self._fenced(
                state=ExportState.FAILED,
                failure_code=code[:64],
                error_message=redact_text(message),
                staged_key="",
                staged_checksum="",
                staged_bytes=None,
                staged_rows=None,
                finished_at=timezone.now(),
            )
        except Exception:  # stale or unreachable: the job's own record says what happened
            return
        self._clean_temps()

    def _last_attempt_gives_up(self, exc: Retryable) -> None:
        if self.ctx.attempt >= self.ctx.lease.max_attempts:
            self._give_up(code="attempts_exhausted", message=str(exc))

    # -- helpers ------------------------------------------------------------------------------
    def _fenced(self, **fields: Any) -> None:
        """Update the export row only while this attempt holds the job's live lease.

        The engine's strict fence (ctx.hold_lease) locks the job row in the same transaction, so
        the export record can never be written by an attempt whose job was reclaimed meanwhile: a
        stale attempt gets StaleAttempt with the engine's reason and writes nothing.
        """
        with self.ctx.waiting("db"), transaction.atomic():
            self.ctx.hold_lease()
            updated = Export.objects.filter(pk=self.export_id, state__in=[ExportState.QUEUED, ExportState.RUNNING]).update(
                **fields, updated_at=timezone.now()
            )
        if updated == 1:
            return
        self.ctx.heartbeat()  # raises StaleAttempt with the engine's reason if the lease is gone
        raise TerminalFailure(f"export {self.export_id} is no longer queued or running", code="export_not_active")

    def _clean_temps(self) -> None:
        """Delete temporary objects of dead attempts (and a staged one that is no longer needed)."""
        with self.ctx.waiting("storage"):
            for key in self.store.temp_keys(self.export_id):
                if key != self.own_temp:
                    self.store.delete(key)

    def _quietly_delete(self, key: str) -> None:
        try:
            with self.ctx.waiting("storage"):
                self.store.delete(key)
        except OSError:
            pass  # the next attempt (or remove_stale_temp_objects) removes it

    def _phase(self, phase: str) -> None:
        export_phase.send_robust(sender=ExportAttempt, export_id=self.export_id, attempt=self.ctx.attempt, phase=phase)

    @staticmethod
    def _result(key: str, sha256: str, size: int, rows: int) -> dict[str, Any]:
        return {"key": key, "sha256": sha256, "bytes": size, "rows": rows}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"storage error {name}: {exc.strerror}"
    if isinstance(exc, psycopg.OperationalError | OperationalError | InterfaceError):
        return f"database connection problem: {type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}"


@job_kind(
    "export.csv",
    version=1,
    queue="exports",
    max_attempts=5,
    # A backstop only: the export stops itself at its own time limit, checked between batches
    # and enforced by the server as a statement timeout.
    timeout_seconds=float(settings.KOALA_EXPORT_MAX_SECONDS) + 300.0,
    backoff_base=1.0,
    backoff_cap=60.0,
    required_fields={"export_id"},
    validate=_validate,
    # A finished export never reverts (docs/exports.md): a retried job would end at once.
    retry_instead="request a new export instead (koala_export create or exports.services.request_export)",
)
def export_csv(ctx: JobContext, data: dict[str, Any]) -> dict[str, Any]:
    return ExportAttempt(ctx, int(data["export_id"])).run()
