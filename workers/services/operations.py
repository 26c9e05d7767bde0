"""People's side of the operations ledger: settling an outcome no reconcile hook could."""

from __future__ import annotations

import json

from django.db import connection, transaction
from django.db.models import QuerySet

from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from workers import sql
from workers.errors import SafetyError
from workers.models import JobState, Operation, OperationState, ParkReason, Resolution
from workers.services import budgets
from workers.services.jobs import unpark_jobs

OPEN_STATES = (OperationState.IN_FLIGHT, OperationState.UNCERTAIN)


def needing_attention() -> QuerySet[Operation]:
    """Open operations of jobs parked needs_attention, oldest first."""
    return (
        Operation.objects.filter(state__in=OPEN_STATES, job__state=JobState.PARKED, job__park_reason=ParkReason.NEEDS_ATTENTION)
        .select_related("job")
        .order_by("updated_at")
    )


def resolve_operation(*, operation_id: int, happened: bool, note: str, actor: str, external_id: str = "") -> Operation:
    """A person settles an uncertain operation.

    ``happened=True`` (with the provider's external id) records it as done: the re-run
    skips it. ``happened=False`` records that it did not take effect: the re-run sends it
    again under the same key. Either way the parked job is queued again. Refused (nothing
    changed) unless the job is parked needing attention or has finished.
    """
    if not actor:
        raise SafetyError("a resolution needs the name of the person resolving it.")
    if not note or not note.strip():
        raise SafetyError("a resolution needs a note saying how you know.")
    if happened and not external_id.strip():
        raise SafetyError("say which external id proves it happened (the provider's id for it).")
    text = redact_text(note.strip(), limit=1000)
    proof = redact_text(external_id.strip(), limit=200) if happened else ""
    with transaction.atomic(), connection.cursor() as cursor:
        # Lock order: the job row first, then its operation, as the worker's ledger and every
        # other writer of both do. Holding the job row means no requeue, claim or cancel can
        # change its state until we commit, so the state the UPDATE below tests stays true.
        cursor.execute(sql.LOCK_JOB_OF_OPERATION, [operation_id])
        job_row = cursor.fetchone()
        if job_row is None:
            raise SafetyError(f"operation {operation_id} does not exist.")
        op = Operation.objects.select_for_update().get(pk=operation_id)
        held = op.reservations
        # The conditional UPDATE decides (operation still open, job in a resolvable state: see
        # sql.RESOLVE_OPERATION for which states are and why).
        cursor.execute(
            sql.RESOLVE_OPERATION,
            [
                OperationState.RECONCILED if happened else OperationState.FAILED,
                Resolution.MANUAL_HAPPENED if happened else Resolution.MANUAL_ABSENT,
                happened,
                proof,
                happened,
                json.dumps({"external_id": proof, "resolved_manually": True}),
                happened,
                redact_text(f"resolved by {actor}: {text}"),
                operation_id,
            ],
        )
        if cursor.rowcount != 1:
            if op.state not in OPEN_STATES:
                raise SafetyError(
                    f"operation {operation_id} is {op.state}; only in-flight or uncertain operations need resolving."
                )
            _, job_state, park_reason = job_row
            shown = f"{job_state} ({park_reason})" if park_reason else job_state
            raise SafetyError(
                f"job {op.job_id} is {shown}; an operation is resolved only while its job is parked needing attention "
                "or has finished. A queued or running attempt reconciles it itself."
            )
        if happened:
            budgets.settle(reservations=held, actual_minor=op.estimate_minor)
        else:
            budgets.release(reservations=held, refund_request=True)
        requeued = unpark_jobs(job_ids=[op.job_id], reason=ParkReason.NEEDS_ATTENTION)
        op.refresh_from_db()
        record_audit(
            actor=actor,
            action=AuditAction.OPERATION_RESOLVE,
            target_type="operation",
            target_id=operation_id,
            details={
                "job": op.job_id,
                "happened": happened,
                "external_id": op.external_id,
                "note": text,
                "requeued": bool(requeued),
            },
        )
    return op
