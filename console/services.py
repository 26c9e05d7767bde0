"""The console's writes: operator actions on jobs, one by one or on a selection.

Each job goes through the engine's own audited service (``workers.services.jobs``); a bulk
action adds one summary row saying what was selected and by whom. Other pages write through
the owning app's services directly (pauses, budgets, operations, reviews, exports).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from koala.audit import AuditAction, record_audit
from workers.errors import JobStateError
from workers.models import Job
from workers.services.jobs import cancel_job, requeue_job, retry_job

ACTIONS = {"cancel": "Cancelled", "retry": "Retried", "requeue": "Requeued"}
# The summary row of each bulk action (each job's own row is its service's).
BULK_AUDIT = {"cancel": AuditAction.BULK_CANCEL, "retry": AuditAction.BULK_RETRY, "requeue": AuditAction.BULK_REQUEUE}
BULK_LIMIT = 500  # one request changes at most this many jobs; a bigger selection must be narrowed


@dataclass
class ActionResult:
    verb: str
    done: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def job_action(*, action: str, job_id: int, actor: str, reason: str = "") -> str:
    """Run one operator action through the engine's service; returns a message for the person."""
    if action == "cancel":
        cancel_job(job_id=job_id, actor=actor, reason=reason or f"cancelled by {actor} in the console")
        return f"Job {job_id} cancelled."
    if action == "retry":
        # retry_job refuses kinds that say how to try again instead (an export is requested anew).
        new = retry_job(job_id=job_id, actor=actor)
        return f"Job {job_id} retried as job {new.job_id}."
    if action == "requeue":
        requeue_job(job_id=job_id, actor=actor)
        return f"Job {job_id} requeued."
    raise JobStateError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}.")


def bulk_job_action(*, action: str, job_ids: list[int], actor: str, reason: str = "", selection: dict[str, str]) -> ActionResult:
    """The same action on many jobs, each through its own audited service call.

    One job's wrong state does not stop the others; the person sees which ones failed and why.
    A summary row records what was selected (ids or filter) and by whom.
    """
    if action not in ACTIONS:
        raise JobStateError(f"unknown action {action!r}; use one of {', '.join(ACTIONS)}.")
    if len(job_ids) > BULK_LIMIT:
        raise JobStateError(f"{len(job_ids)} jobs selected; at most {BULK_LIMIT} per request. Narrow the filter.")
    result = ActionResult(verb=ACTIONS[action])
    for job_id in job_ids:
        try:
            job_action(action=action, job_id=job_id, actor=actor, reason=reason)
            result.done.append(job_id)
        except (JobStateError, Job.DoesNotExist) as exc:
            result.errors.append(str(exc))
    with transaction.atomic():
        record_audit(
            actor=actor,
            action=BULK_AUDIT[action],
            target_type="job",
            target_id=f"{len(result.done)} jobs",
            details={"selection": selection, "done": result.done[:100], "errors": len(result.errors)},
        )
    return result
