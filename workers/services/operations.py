"""People's side of the operations ledger: settling an outcome no reconcile hook could."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from koala.audit import record_audit
from koala.redaction import redact_text
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
    again under the same key. Either way the parked job is queued again.
    """
    if not actor:
        raise SafetyError("a resolution needs the name of the person resolving it.")
    if not note or not note.strip():
        raise SafetyError("a resolution needs a note saying how you know.")
    if happened and not external_id.strip():
        raise SafetyError("say which external id proves it happened (the provider's id for it).")
    text = redact_text(note.strip(), limit=1000)
    with transaction.atomic():
        op = Operation.objects.select_for_update().filter(pk=operation_id).first()
        if op is None:
            raise SafetyError(f"operation {operation_id} does not exist.")
        if op.state not in OPEN_STATES:
            raise SafetyError(f"operation {operation_id} is {op.state}; only in-flight or uncertain operations need resolving.")
        held = op.reservations
        if happened:
            op.state = OperationState.RECONCILED
            op.resolution = Resolution.MANUAL_HAPPENED
            op.external_id = redact_text(external_id.strip(), limit=200)
            op.result = {"external_id": op.external_id, "resolved_manually": True}
            op.cost_minor = op.estimate_minor
            budgets.settle(reservations=held, actual_minor=op.estimate_minor)
        else:
            op.state = OperationState.FAILED
            op.resolution = Resolution.MANUAL_ABSENT
            budgets.release(reservations=held, refund_request=True)
        op.reservations = []
        op.error_message = redact_text(f"resolved by {actor}: {text}")
        op.settled_at = timezone.now()
        op.save()
        requeued = unpark_jobs(job_ids=[op.job_id], reason=ParkReason.NEEDS_ATTENTION)
        record_audit(
            actor=actor,
            action="operation.resolve",
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
