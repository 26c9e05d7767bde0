"""The one transition writer: how a job's state changes are recorded, whoever makes them.

Every ending of an attempt is decided first, as a value (``workers.outcomes.decide``), and then
written here, by one function, ``end_attempt``, whatever ran the body:

- an RQ worker (``WorkerRuntime._report``, which adds retries through a dropped connection and
  the log line a person reads),
- an HTTP worker's complete and fail calls and the ledger's parks (``api.protocol``, which answers
  a rejection with its 409),
- a lease the API claimed for an acquire that had ended before it was sent (``give_back``),
- an attempt a worker cannot serve (``unservable``: the backoff counts the job's earlier ones).

Each decision is one fenced statement (``sql.COMPLETE`` … ``sql.RELEASE``, all ``sql._FINISH``):
the job's new state, the attempt's outcome, error, timings and usage, and its run time on the
budgets that count it, in one commit. The same names (``outcomes.error_class_of``), the same retry
rule, the same usage accounting (what the ledger's operations cost is added when they settle,
what the body reports when the attempt ends) hold for both kinds of worker.

The reaper's transitions (``reap``: orphaned attempts, requeued or failed jobs, queued jobs past
their deadline) are written here too; the services that change a job for a person (cancel,
requeue, a review's rejection, unpark, a budget's park at claim) write their own conditional
UPDATE and report it through ``reached``.

Each ending's one log line (``log_outcome``: job, attempt, kind, queue, outcome, reason, time
split; structured under KOALA_LOG_FORMAT=json) is written by the caller once the writer answered,
so a line never claims what the database refused.

Whatever the path, the apps above the engine are told through ``workers.hooks``
(``register_on_transition``) inside the transaction that records the change: a workflow's
dependants become due, a metric counts, in the same commit or not at all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connection, transaction

from koala import redaction
from koala.redaction import Redactor, redact_text
from workers import doorbell, hooks, outcomes, sql
from workers.errors import Rejection
from workers.hooks import AttemptSpans, BodySpan, Transition
from workers.models import FailureReason, JobState, Outcome, ParkReason
from workers.spans import attempt_span_id

log = logging.getLogger("koala.worker")

if TYPE_CHECKING:
    from workers.models import Job
    from workers.services.leases import Lease


@dataclass(frozen=True)
class Report:
    """What an attempt reports at its end, besides the outcome: its time split, and the usage the
    body itself counted (tokens, calls; what the ledger's operations cost is already on the job)."""

    compute_seconds: float = 0.0
    db_wait_seconds: float = 0.0
    storage_wait_seconds: float = 0.0
    usage: dict[str, Any] | None = None
    # The spans the body recorded (ctx.span, the ledger's operations, an HTTP worker's report):
    # handed to the span sinks (workers.hooks) in the ending's transaction, if it lands.
    spans: tuple[BodySpan, ...] = ()


# -- the fence's answer --------------------------------------------------------------------------------


def rejection_for(*, job_id: int, lease_token: int, reporting: str | None = None) -> Rejection:
    """Why a fenced write by attempt ``lease_token`` matched no row.

    ``reporting`` is the outcome the attempt tried to record; if exactly that is already
    stored for this attempt, the repeat is ``already_recorded`` (the worker treats it as done).
    The rejection counters (``workers.hooks.count_rejection``) are told its name.
    """
    rejection = _rejection_for(job_id=job_id, lease_token=lease_token, reporting=reporting)
    hooks.count_rejection(rejection.value)
    return rejection


def _rejection_for(*, job_id: int, lease_token: int, reporting: str | None) -> Rejection:
    with connection.cursor() as cursor:
        cursor.execute(sql.REJECTION_FOR, [lease_token, job_id])
        row = cursor.fetchone()
    if row is None:
        return Rejection.LEASE_SUPERSEDED
    state, current_token, my_outcome, requeued_by = row
    # The attempt row is keyed by this token: if it already holds exactly this report, the
    # report landed (its reply was lost), whoever has claimed the job since.
    if reporting is not None and my_outcome == reporting:
        return Rejection.ALREADY_RECORDED
    if state == JobState.CANCELLED:
        return Rejection.JOB_CANCELLED
    if current_token != lease_token:
        return Rejection.LEASE_SUPERSEDED
    # Nobody has claimed the job since. If this attempt already recorded its own end (a report
    # of another outcome after its first landed: fail after complete, complete after a terminal
    # fail), that end stands and the worker has nothing left to do: already_recorded, not
    # lease_expired, which would tell it that the reaper still decides a job that is settled.
    # The reaper's orphaned mark and an operator's requeue are not this attempt's own ends.
    if reporting is not None and my_outcome in _OWN_ENDS and not (my_outcome == Outcome.INTERRUPTED and requeued_by):
        return Rejection.ALREADY_RECORDED
    return Rejection.LEASE_EXPIRED


# Outcomes an attempt records for itself (through end_attempt), as opposed to the reaper's ORPHANED
# and the CANCELLED an operator's cancel writes.
_OWN_ENDS = (Outcome.SUCCEEDED, Outcome.RETRY, Outcome.FAILED, Outcome.PARKED, Outcome.UNSERVABLE, Outcome.INTERRUPTED)


# -- an attempt's end ------------------------------------------------------------------------------------


def outcome_of(decision: outcomes.Decision) -> str | None:
    """The outcome the attempt's row records for ``decision``; None for Discard (nothing is written)."""
    match decision:
        case outcomes.Complete():
            return Outcome.SUCCEEDED
        case outcomes.RetryLater():
            return Outcome.RETRY
        case outcomes.Fail():
            return Outcome.FAILED
        case outcomes.Park():
            return Outcome.PARKED
        case outcomes.Release(outcome=outcome):
            return outcome
        case outcomes.Discard():
            return None
    raise TypeError(f"not a decision: {decision!r}")


def _statement(decision: outcomes.Decision) -> tuple[str, dict[str, Any]]:
    """The fenced statement that records ``decision`` and its transition's own values."""
    match decision:
        case outcomes.Complete(result=result, state_delta=state_delta):
            return sql.COMPLETE, {
                "result": json.dumps(result, default=str),
                "state_delta": json.dumps(state_delta or {}, default=str),
            }
        case outcomes.RetryLater(delay_seconds=delay, error_class=error_class, message=message):
            return sql.RETRY_LATER, {
                "delay_seconds": delay,
                "error_class": error_class[:200],
                "error_message": redact_text(message),
            }
        case outcomes.Fail(reason=reason, error_class=error_class, message=message):
            return sql.FAIL, {
                "reason": FailureReason(reason).value,
                "error_class": error_class[:200],
                "error_message": redact_text(message),
            }
        case outcomes.Park(reason=reason, detail=detail, parked_on=parked_on):
            if reason not in ParkReason.values:
                raise ValueError(f"unknown park reason {reason!r}")
            text = redact_text(detail)
            return sql.PARK, {
                "reason": reason,
                "detail": text,
                "error_message": text,
                "parked_on": json.dumps(parked_on or {}, default=str),
            }
        case outcomes.Release(outcome=outcome, message=message, delay_seconds=delay):
            if outcome not in (Outcome.INTERRUPTED, Outcome.UNSERVABLE):
                raise ValueError(f"release cannot record {outcome!r}")
            return sql.RELEASE, {"delay_seconds": delay, "error_message": redact_text(message)}
    raise TypeError(f"not a decision to write: {decision!r}")


def end_attempt(decision: outcomes.Decision, lease: Lease, report: Report | None = None) -> Rejection | None:
    """Record ``decision`` for attempt ``lease``: None when it landed, else the rejection by name.

    One fenced statement; with an app listening for transitions, that statement and the app's
    callbacks share one transaction (a callback that raises undoes the ending, and the caller
    sees the error); the body's spans go to the span sinks in that transaction too. A released
    attempt used nothing, so its row records only the outcome: the
    report is dropped for it, as it always was.
    """
    outcome = outcome_of(decision)
    if outcome is None:
        return None
    # The body's spans are kept whatever the ending (a released attempt's body did run, up to
    # its safe point); what it used is not, for a released attempt (as it always was).
    spans = report.spans if report is not None and hooks.wants_spans() else ()
    statement, params = _params(decision, lease, report, outcome)
    if hooks.wants_transitions() or spans:
        with transaction.atomic():
            row = _execute(statement, params)
            if row is not None:
                change = _transition(row, outcome=outcome, cause="attempt")
                if isinstance(decision, outcomes.Complete):
                    change = dataclasses.replace(change, result=decision.result, state_delta=dict(decision.state_delta or {}))
                hooks.run_on_transition([change])
                if spans:
                    hooks.record_spans(_attempt_spans(lease, spans))
    else:
        row = _execute(statement, params)  # one statement, its own commit: the hot path's cost
    if row is not None:
        return None
    return rejection_for(job_id=lease.job_id, lease_token=lease.lease_token, reporting=outcome)


def _params(decision: outcomes.Decision, lease: Lease, report: Report | None, outcome: str) -> tuple[str, dict[str, Any]]:
    """The fenced statement recording ``decision`` for ``lease`` and all its parameters. A released
    attempt used nothing, so its report's usage and timings are not stored."""
    statement, values = _statement(decision)
    if isinstance(decision, outcomes.Release):
        report = None
    report = report or Report()
    params = {
        "error_class": "",
        "error_message": "",
        **values,
        "job_id": lease.job_id,
        "lease_token": lease.lease_token,
        "outcome": outcome,
        "usage": json.dumps(countable(report.usage)),
        "compute_seconds": report.compute_seconds,
        "db_wait_seconds": report.db_wait_seconds,
        "storage_wait_seconds": report.storage_wait_seconds,
    }
    return statement, params


@dataclass(frozen=True)
class Ending:
    """One attempt's end in a batch (end_attempts): the decision, the lease it ends, the report,
    and the redaction context its body ran under (the span sinks store its spans through it)."""

    decision: outcomes.Decision
    lease: Lease
    report: Report | None = None
    redactor: Redactor | None = None


def end_attempts(endings: Sequence[Ending]) -> list[Rejection | None]:
    """Record several attempts' ends at once: in order, one answer per ending, each exactly what
    ``end_attempt`` would have answered for it alone.

    The completions (``outcomes.Complete``, the common case) are one statement,
    ``sql.COMPLETE_MANY``, which fences every row by its own lease token: an attempt whose lease
    was lost meanwhile is left out, and only it is refused (by name, from ``rejection_for``); the
    others land. Any other ending is its own fenced statement, in the same transaction. The
    on-transition callbacks are told of every landed row once, in that transaction (one call for
    the batch, as the reaper tells them of its batch), and each landed attempt's spans go to the
    span sinks under its own redaction context. One commit for the batch.
    """
    if not endings:
        return []
    landed: dict[int, Transition] = {}  # index in endings -> its transition
    completions = [(i, e) for i, e in enumerate(endings) if isinstance(e.decision, outcomes.Complete)]
    with transaction.atomic():
        if completions:
            rows = [_completion_row(e) for _i, e in completions]
            with connection.cursor() as cursor:
                cursor.execute(
                    sql.COMPLETE_MANY, {"rows": json.dumps(rows, default=str), "job_ids": [row["job_id"] for row in rows]}
                )
                got = {int(row[0]): row for row in cursor.fetchall()}
            for i, e in completions:
                row = got.get(e.lease.job_id)
                if row is not None:
                    decision = e.decision
                    assert isinstance(decision, outcomes.Complete)
                    landed[i] = dataclasses.replace(
                        _transition(row, outcome=Outcome.SUCCEEDED, cause="attempt"),
                        result=decision.result,
                        state_delta=dict(decision.state_delta or {}),
                    )
        for i, e in enumerate(endings):
            outcome = outcome_of(e.decision)
            if outcome is None or isinstance(e.decision, outcomes.Complete):
                continue
            statement, params = _params(e.decision, e.lease, e.report, outcome)
            row = _execute(statement, params)
            if row is not None:
                landed[i] = _transition(row, outcome=outcome, cause="attempt")
        hooks.run_on_transition([landed[i] for i in sorted(landed)])
        if hooks.wants_spans():
            for i in sorted(landed):
                e = endings[i]
                if e.report is not None and e.report.spans:
                    with redaction.bind(e.redactor or redaction.EMPTY):
                        hooks.record_spans(_attempt_spans(e.lease, e.report.spans))
    answers: list[Rejection | None] = []
    for i, e in enumerate(endings):
        outcome = outcome_of(e.decision)
        if outcome is None or i in landed:
            answers.append(None)
        else:
            answers.append(rejection_for(job_id=e.lease.job_id, lease_token=e.lease.lease_token, reporting=outcome))
    return answers


def _completion_row(ending: Ending) -> dict[str, Any]:
    decision = ending.decision
    assert isinstance(decision, outcomes.Complete)
    report = ending.report or Report()
    return {
        "job_id": ending.lease.job_id,
        "token": ending.lease.lease_token,
        "result": decision.result,  # the whole batch is one JSON document (json.dumps default=str)
        "state_delta": decision.state_delta or {},
        "add_usage": countable(report.usage),
        "compute_seconds": report.compute_seconds,
        "db_wait_seconds": report.db_wait_seconds,
        "storage_wait_seconds": report.storage_wait_seconds,
    }


def _attempt_spans(lease: Lease, spans: Sequence[BodySpan]) -> AttemptSpans:
    span_id = attempt_span_id(trace_id=lease.trace_id, job_id=lease.job_id, lease_token=lease.lease_token)
    return AttemptSpans(
        job_id=lease.job_id, attempt_id=lease.attempt_id, trace_id=lease.trace_id, attempt_span_id=span_id, spans=spans
    )


def _execute(statement: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchone()


def countable(usage: dict[str, Any] | None) -> dict[str, float]:
    """The countable part of a usage: finite numbers only (a model's name is not summed, and a NaN
    or an infinity counted by mistake would make the sum unstorable)."""
    return {k: v for k, v in (usage or {}).items() if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def _transition(row: Sequence[Any], *, outcome: str | None, cause: str) -> Transition:
    """A (id, kind, version, queue, state, failure_reason) row as the hook is told of it."""
    job_id, kind, version, queue, state, failure_reason = row[:6]
    return Transition(
        job_id=int(job_id),
        kind=kind,
        version=int(version),
        queue=queue,
        state=state,
        outcome=outcome,
        failure_reason=failure_reason,
        cause=cause,
    )


def unservable(lease: Lease, *, worker: str) -> outcomes.Decision:
    """The decision for an attempt ``worker`` cannot serve: released, backing off with the job's
    earlier unservable attempts (so a job nobody serves costs a few rows a minute, not one a second)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.COUNT_UNSERVABLE, [lease.job_id])
        (earlier,) = cursor.fetchone()
    return outcomes.decide(outcomes.Unservable(worker=worker, earlier=int(earlier)), lease, None)


def give_back(leases_: Sequence[Lease], *, why: str) -> None:
    """Give back leases whose bodies never started (claimed for a request that had ended): the
    attempt is not used, any delivery mode goes back to the queue."""
    for lease in leases_:
        end_attempt(outcomes.decide(outcomes.GivenBack(why=why), lease, None), lease)


def refuse_completion(*, job_id: int, error_class: str, message: str) -> Transition | None:
    """An on-transition callback refuses a completion it was just told of: the job (and its
    attempt) end failed, terminal, with ``error_class`` instead, in the completion's own
    transaction, so no one ever sees the success (a workflow step whose state delta would make
    its run's state too large). None when the job is no longer succeeded (nothing changed)."""
    if not connection.in_atomic_block:
        raise RuntimeError("refuse_completion() runs inside the completion's transaction (an on-transition callback)")
    with connection.cursor() as cursor:
        cursor.execute(
            sql.REFUSE_COMPLETION, {"job_id": job_id, "error_class": error_class[:200], "error_message": redact_text(message)}
        )
        row = cursor.fetchone()
    return _transition(row, outcome=Outcome.FAILED, cause="attempt") if row else None


# -- the line a person reads ------------------------------------------------------------------------------

# The most of an error's message an outcome line carries (the attempt row keeps it whole).
OUTCOME_ERROR_CHARS = 200


def log_outcome(
    lease: Lease,
    decision: outcomes.Decision,
    report: Report | None,
    *,
    elapsed: float,
    rejection: Rejection | None = None,
    unrecorded: bool = False,
) -> None:
    """The one line per attempt outcome, logged by the caller of the writer once it answered (an RQ
    worker's every ending passes ``WorkerRuntime._report`` or the batch's ``_flush``; another
    caller of ``end_attempt`` logs its endings here too): the job, attempt, kind, queue, outcome,
    reason and the time split, in words for a person and as fields (``extra``) for
    KOALA_LOG_FORMAT=json (koala/log_format.py). ``elapsed`` is the attempt's whole run time;
    ``rejection`` the writer's answer; ``unrecorded`` that the write gave up. The message and the
    fields go through the redaction context bound by the caller (the attempt's)."""
    report = report or Report()
    outcome = outcome_of(decision) or "discarded"
    reason = ""
    error = ""
    level = logging.INFO
    match decision:
        case outcomes.Complete():
            said = f"succeeded in {took(elapsed)}"
        case outcomes.RetryLater(delay_seconds=delay, error_class=error_class, message=message):
            reason, error = error_class, message
            said = f"failed in {took(elapsed)} ({error_class}); retry in {delay:.1f} s"
        case outcomes.Fail(reason=failure, error_class=error_class, message=message):
            reason, error = str(failure), message
            level = logging.WARNING
            said = f"failed in {took(elapsed)}: {failure} ({error_class})"
        case outcomes.Park(reason=parked, detail=detail):
            reason = parked
            said = f"parked ({parked}) after {took(elapsed)}: {detail}"
        case outcomes.Release(outcome=released, message=message, delay_seconds=delay):
            reason = message
            said = f"released ({released}) after {took(elapsed)}, due again in {delay:.1f} s: {message}"
        case outcomes.Discard(rejection=stale):
            reason = stale.value if stale is not None else ""
            said = f"stopped after {took(elapsed)}; nothing recorded (rejection {reason or 'none'})"
        case _:
            said = f"ended after {took(elapsed)}"
    if unrecorded:
        level = logging.WARNING
        said += "; NOT recorded (the database was away): the lease expires and the reaper decides"
        outcome = "unrecorded"
    elif rejection is Rejection.JOB_CANCELLED:
        said = f"was cancelled while running; its {outcome} report was discarded"
        outcome, reason = "cancelled", rejection.value
    elif rejection is not None:
        level = logging.WARNING
        why = {
            Rejection.LEASE_SUPERSEDED: "it is owned by a newer attempt",
            Rejection.LEASE_EXPIRED: "its lease expired first; the reaper requeues or fails it",
        }.get(rejection, rejection.value)
        said = f"{outcome} report refused ({rejection.value}): {why}"
        outcome, reason = "refused", rejection.value
    timings = (
        f"compute {took(report.compute_seconds)}, db wait {took(report.db_wait_seconds)}, "
        f"storage wait {took(report.storage_wait_seconds)}"
    )
    # The error's message (already masked by decide), bounded: a line stays a line.
    error = error if len(error) <= OUTCOME_ERROR_CHARS else error[: OUTCOME_ERROR_CHARS - 1] + "…"
    log.log(
        level,
        "job %s (%s, attempt %s, queue %s) %s [%s]%s",
        lease.job_id,
        lease.kind,
        lease.attempts,
        lease.queue,
        said,
        timings,
        f": {error}" if error else "",
        extra={
            "event": "attempt_outcome",
            "job_id": lease.job_id,
            "attempt": lease.attempts,
            "kind": lease.kind,
            "version": lease.version,
            "queue": lease.queue,
            "outcome": outcome,
            "reason": reason,
            "error": error,
            "total_seconds": round(elapsed, 6),
            "compute_seconds": round(report.compute_seconds, 6),
            "db_wait_seconds": round(report.db_wait_seconds, 6),
            "storage_wait_seconds": round(report.storage_wait_seconds, 6),
        },
    )


def took(seconds: float) -> str:
    """A run time as a person reads it: "12 ms", "3.2 s"."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


# -- the reaper ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReapReport:
    orphaned: int
    requeued: int
    failed: int
    deadline_failed: int


def reap(*, grace_seconds: float) -> ReapReport:
    """Expired lease → attempt orphaned. After the grace period: at_least_once requeues (if
    attempts and time remain), everything else fails ``orphaned``; queued jobs past their deadline
    fail ``deadline_exceeded``. Every job moved is reported to the hook in the same transaction."""
    # One transaction: the row locks the first statement takes (FOR NO KEY UPDATE SKIP LOCKED,
    # see sql.REAP_ORPHAN_ATTEMPTS) last until COMMIT, so the requeue and fail statements act on
    # the rows it orphaned, and a concurrent replica skips them.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.REAP_ORPHAN_ATTEMPTS)
        orphaned = cursor.rowcount
        cursor.execute(sql.REAP_REQUEUE, [grace_seconds])
        requeued = cursor.fetchall()
        cursor.execute(sql.REAP_FAIL, [grace_seconds])
        failed = cursor.fetchall()
        cursor.execute(sql.FAIL_PAST_DEADLINE)
        deadline_failed = cursor.fetchall()
        reached(
            [_transition(row, outcome=Outcome.ORPHANED, cause="reaper") for row in (*requeued, *failed)]
            + [_transition(row, outcome=None, cause="deadline") for row in deadline_failed]
        )
        ring_after_commit(requeued)
    return ReapReport(orphaned=orphaned, requeued=len(requeued), failed=len(failed), deadline_failed=len(deadline_failed))


# -- people's and the beat's transitions ----------------------------------------------------------------------


def reached(changes: Sequence[Transition]) -> None:
    """Tell the apps above that these jobs reached their states: call inside the transaction that
    changed them, after the change (the services of workers.services.jobs, the reaper)."""
    hooks.run_on_transition(changes)


def transition_of(job: Job, *, outcome: str | None, cause: str) -> Transition:
    """A job row a service has just saved, as the hook is told of it."""
    return _transition((job.pk, job.kind, job.version, job.queue, job.state, job.failure_reason), outcome=outcome, cause=cause)


def transitions_of(rows: Sequence[Sequence[Any]], *, outcome: str | None, cause: str) -> list[Transition]:
    """(id, kind, version, queue, state, failure_reason) rows, as the hook is told of them."""
    return [_transition(row, outcome=outcome, cause=cause) for row in rows]


def ring_after_commit(rows: Sequence[Sequence[Any]]) -> None:
    """Ring the doorbell, once the transaction commits, for the jobs of (id, kind, version, queue, …)
    rows that became queued."""
    by_queue: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        job_id, _kind, version, queue = row[:4]
        by_queue.setdefault(queue, []).append((int(job_id), int(version)))
    if by_queue:
        transaction.on_commit(lambda: [doorbell.ring(q, jobs) for q, jobs in by_queue.items()])
