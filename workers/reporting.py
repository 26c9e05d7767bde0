"""The one mapping from a decision (workers.outcomes) to the fenced lease service call that records it.

Both writers of an attempt's end use it: the RQ runtime (``WorkerRuntime._report``, which adds
retries through a dropped connection and the log line a person reads) and the HTTP worker
protocol (api.protocol, which answers the worker with the rejection). So an attempt ends the
same way whichever kind of worker ran it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from workers import outcomes
from workers.errors import Rejection
from workers.models import Outcome
from workers.services import leases
from workers.services.leases import Lease, Report

Write = Callable[[], Rejection | None]


def transition(decision: outcomes.Decision, lease: Lease, report: Report | None = None) -> tuple[str, Write] | None:
    """The outcome ``decision`` records and the call that writes it; None for Discard (nothing is written)."""
    report = report or Report()
    fence = {"job_id": lease.job_id, "lease_token": lease.lease_token}
    match decision:
        case outcomes.Discard():
            return None
        case outcomes.Complete(result=result, state_delta=state_delta):
            return Outcome.SUCCEEDED, partial(leases.complete, **fence, result=result, state_delta=state_delta, report=report)
        case outcomes.RetryLater(delay_seconds=delay, error_class=error_class, message=message):
            return Outcome.RETRY, partial(
                leases.retry_later, **fence, delay_seconds=delay, error_class=error_class, message=message, report=report
            )
        case outcomes.Fail(reason=reason, error_class=error_class, message=message):
            return Outcome.FAILED, partial(
                leases.fail, **fence, reason=reason, error_class=error_class, message=message, report=report
            )
        case outcomes.Park(reason=reason, detail=detail, parked_on=parked_on):
            return Outcome.PARKED, partial(leases.park, **fence, reason=reason, detail=detail, parked_on=parked_on, report=report)
        case outcomes.Release(outcome=outcome, message=message, delay_seconds=delay):
            # No report: a released attempt used nothing (its row records only the outcome).
            return outcome, partial(leases.release, **fence, outcome=outcome, message=message, delay_seconds=delay)
    raise TypeError(f"not a decision: {decision!r}")
