"""Workflow runs' writes: start, signal, cancel, move, and the engine's hook that advances a run.

Lock order, everywhere: a job's row (the engine's transition holds it), then the run's row
(``SELECT … FOR UPDATE``), then the run's step and signal rows. Every writer of a run takes the
run's row first, so a run's changes are serial; what would take a job's row while holding the run's
(cancelling a step's job when the run ends) runs after the commit, in transactions of its own
(``transaction.on_commit``; the beat's sweep catches what a crash left).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from flows import decide
from flows.errors import (
    BadInput,
    BadSignal,
    IdempotencyConflict,
    RunFinished,
    SignalTooLarge,
    TooManyPendingSignals,
    UnknownDefinition,
    UnknownRun,
    UnknownVersion,
)
from flows.models import (
    LIVE_RUN_STATES,
    LIVE_STEP_STATES,
    TERMINAL_RUN_STATES,
    Run,
    RunState,
    RunStep,
    Signal,
    SignalStatus,
    StepState,
)
from koala.audit import AuditAction, record_audit
from koala.redaction import redact_text
from workers import definitions, transitions
from workers.definitions import (
    MAX_PENDING_SIGNALS,
    MAX_RUN_STATE_BYTES,
    MAX_SIGNAL_PAYLOAD_BYTES,
    BadRunInput,
    OnTimeout,
    Step,
    Workflow,
    json_size,
)
from workers.errors import EnqueueError, JobStateError
from workers.hooks import Transition
from workers.models import TERMINAL_STATES, Job, JobState
from workers.services import jobs
from workers.services.jobs import JobSpec

logger = logging.getLogger(__name__)

FLOWS_ACTOR = "flows"  # who the engine's records name for what a run does on its own


@dataclass(frozen=True)
class StartedRun:
    run: Run
    created: bool  # False: an earlier run with the same key and input


@dataclass(frozen=True)
class SignalAnswer:
    outcome: Literal["resumed", "buffered", "duplicate", "rejected"]
    signal_id: int | None


def trace_id_of(run_id: int) -> str:
    """A run's trace id (32 hex, W3C): derived from its id, so every step's span shares it."""
    return hashlib.sha256(f"koala-run:{run_id}".encode()).hexdigest()[:32]


def operation_key_base_of(run_id: int, step: str) -> str:
    """The key a step's operations are sent under: stable across its retries, reclaims and moves."""
    return f"koala-run-{run_id}-{step}"


def input_digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def definition_of(name: str, version: int | None) -> Workflow:
    """The definition ``name@version`` (the newest without a version), or a named error."""
    known = definitions.versions(name) if isinstance(name, str) else []
    if not known:
        names = sorted({d.name for d in definitions.definitions()})
        raise UnknownDefinition(f"no workflow named {name!r}; known: {', '.join(names) or 'none'}")
    if version is None:
        version = known[-1]
    found = definitions.get(name, version) if isinstance(version, int) and not isinstance(version, bool) else None
    if found is None:
        raise UnknownVersion(f"workflow {name!r} has no version {version!r}; known: {', '.join(map(str, known))}")
    return found


# -- start ---------------------------------------------------------------------------------------------------


def start_run(
    *,
    definition: str,
    version: int | None = None,
    input: dict[str, Any],
    idempotency_key: str | None = None,
    actor: str,
    correlation_id: str = "",
) -> StartedRun:
    """Start a run of ``definition`` (its newest version unless ``version``) with ``input``.

    The same ``idempotency_key`` with the same input returns the earlier run (``created`` False);
    with other input it raises IdempotencyConflict. An unknown definition or version, or a bad
    input, raises its named error (UnknownDefinition, UnknownVersion, BadInput) and writes
    nothing. The root steps' jobs are enqueued in the same transaction (their doorbell rings on
    commit); an audit row names ``actor``.
    """
    found = definition_of(definition, version)
    try:
        found.check_input(input)
    except BadRunInput as exc:
        raise BadInput(str(exc)) from None
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not 0 < len(idempotency_key.strip()) <= 200):
        raise BadInput("idempotency_key must be 1 to 200 characters")
    if not isinstance(correlation_id, str) or len(correlation_id) > 64:
        raise BadInput("correlation_id must be at most 64 characters")
    digest = input_digest(input)
    with transaction.atomic():
        if idempotency_key is not None:
            earlier = _same_key(found.name, idempotency_key, digest)
            if earlier is not None:
                return StartedRun(run=earlier, created=False)
        try:
            with transaction.atomic():
                run = Run.objects.create(
                    definition=found.name,
                    version=found.version,
                    input=input,
                    input_digest=digest,
                    idempotency_key=idempotency_key,
                    created_by=actor,
                    correlation_id=correlation_id,
                )
        except IntegrityError:
            # A concurrent start with the same key committed first: its run is the answer.
            earlier = _same_key(found.name, idempotency_key or "", digest)
            if earlier is None:
                raise
            return StartedRun(run=earlier, created=False)
        run.trace_id = trace_id_of(run.pk)
        run.correlation_id = correlation_id or run.trace_id
        run.save(update_fields=["trace_id", "correlation_id"])
        RunStep.objects.bulk_create([RunStep(run=run, name=name) for name in found.steps])
        record_audit(
            actor=actor,
            action=AuditAction.RUN_START,
            target_type="run",
            target_id=run.pk,
            details={"definition": found.key, "idempotency_key": idempotency_key or ""},
        )
        _advance(run, found)
    run.refresh_from_db()
    return StartedRun(run=run, created=True)


def _same_key(definition: str, key: str, digest: str) -> Run | None:
    earlier = Run.objects.filter(definition=definition, idempotency_key=key).first()
    if earlier is None:
        return None
    if earlier.input_digest != digest:
        raise IdempotencyConflict(
            f"idempotency key {key!r} already started run {earlier.pk} of {definition} with other input; nothing was started"
        )
    return earlier


# -- advancing a run (inside the caller's transaction, the run's row locked) ------------------------------------


def _locked_run(run_id: int) -> Run:
    try:
        return Run.objects.select_for_update().get(pk=run_id)
    except (Run.DoesNotExist, ValueError, TypeError):
        raise UnknownRun(f"no run {run_id!r}") from None


def _rows(run: Run) -> dict[str, RunStep]:
    return {row.name: row for row in RunStep.objects.select_for_update().filter(run=run)}


def _advance(run: Run, definition: Workflow) -> None:
    """Start what is due, skip what must be skipped, resolve waits from buffered signals, and set
    the run's state, until nothing changes. Each step starts by its own conditional UPDATE
    (pending -> queued|waiting): a step is started once, however often this runs."""
    now = timezone.now()
    while True:
        rows = _rows(run)
        moves = decide.next_moves(definition, {name: row.state for name, row in rows.items()})
        if moves.run_state == "failed":
            failed = rows[moves.failed_by]
            _finish(
                run, RunState.FAILED, code=failed.error_code or "step_failed", error=f"step {failed.name} failed: {failed.error}"
            )
            return
        changed = False
        for name in moves.skip:
            changed |= _move(run, name, StepState.PENDING, StepState.SKIPPED, finished_at=now) > 0
        rows = _rows(run) if moves.skip else rows
        for name in moves.due:
            step = definition.steps[name]
            if step.wait is not None:
                deadline = now + timedelta(seconds=step.wait.timeout_seconds) if step.wait.timeout_seconds else None
                if _move(run, name, StepState.PENDING, StepState.WAITING, due_at=now, wait_deadline=deadline):
                    changed |= _consume_buffered(run, step) is not None
            else:
                if _move(run, name, StepState.PENDING, StepState.QUEUED, due_at=now, version=run.version):
                    changed |= not _enqueue_step(run, definition, step, rows)
        if not changed:
            break
    if moves.run_state == "succeeded":
        _finish(run, RunState.SUCCEEDED)
        return
    state = _live_state(run)
    if run.state != state:
        Run.objects.filter(pk=run.pk, state__in=LIVE_RUN_STATES).update(state=state, updated_at=now)
        run.state = state


def _live_state(run: Run) -> str:
    """``running`` while a step's job is live; ``waiting`` while only waits and parked jobs are."""
    states = set(RunStep.objects.filter(run=run).values_list("state", flat=True))
    if StepState.QUEUED not in states and states & {StepState.WAITING, StepState.PARKED}:
        return RunState.WAITING
    return RunState.RUNNING


def _move(run: Run, name: str, from_state: str | tuple[str, ...], to_state: str, **values: Any) -> int:
    """The conditional UPDATE that moves one step: its row count decides (0: someone else did)."""
    sources = (from_state,) if isinstance(from_state, str) else from_state
    return RunStep.objects.filter(run=run, name=name, state__in=sources).update(state=to_state, **values)


def _enqueue_step(run: Run, definition: Workflow, step: Step, rows: dict[str, RunStep]) -> bool:
    """Enqueue the job of a step that has just become due; False when its kind refused it."""
    seen = decide.parent_outputs(
        definition,
        step.name,
        {name: (row.output if row.state == StepState.SUCCEEDED else row.error) for name, row in rows.items()},
        {name: row.state for name, row in rows.items()},
    )
    spec = JobSpec(
        kind=step.kind,
        input=run.input,
        version=run.version,
        correlation_id=run.correlation_id or run.trace_id,
        run_id=run.pk,
        step=step.name,
        steps=seen,
        run_state=run.run_state,
        trace_id=run.trace_id,
        operation_key_base=operation_key_base_of(run.pk, step.name),
    )
    try:
        with transaction.atomic():
            result = jobs.enqueue_many(specs=[spec])[0]
    except EnqueueError as exc:
        # The step's own kind refuses the run's input (its required fields, its size limit): the
        # step fails, and the run follows the step's edges.
        _move(
            run,
            step.name,
            StepState.QUEUED,
            StepState.FAILED,
            error_code="bad_input",
            error=str(exc)[:2000],
            finished_at=timezone.now(),
        )
        return False
    RunStep.objects.filter(run=run, name=step.name).update(job_id=result.job_id)
    return True


def _consume_buffered(run: Run, step: Step) -> Signal | None:
    """A wait just reached: the oldest buffered signal of its event, consumed (the run is locked,
    so no other consumer is racing this one)."""
    assert step.wait is not None
    signal = Signal.objects.filter(run=run, name=step.wait.event, status=SignalStatus.BUFFERED).order_by("id").first()
    if signal is None:
        return None
    _resolve_wait(run, step, signal)
    return signal


def _resolve_wait(run: Run, step: Step, signal: Signal) -> bool:
    now = timezone.now()
    if not _move(
        run, step.name, StepState.WAITING, StepState.SUCCEEDED, output=signal.payload, state_after=run.run_state, finished_at=now
    ):
        return False
    Signal.objects.filter(pk=signal.pk, status=SignalStatus.BUFFERED).update(
        status=SignalStatus.CONSUMED, consumed_by=step.name, consumed_at=now
    )
    return True


def _finish(run: Run, state: str, *, code: str = "", error: str = "") -> bool:
    """End the run (a conditional UPDATE: a terminal run never changes again), end its live
    steps, and cancel their jobs once this commits (each in its own transaction: lock order)."""
    now = timezone.now()
    if not Run.objects.filter(pk=run.pk, state__in=LIVE_RUN_STATES).update(
        state=state, error_code=code, error=redact_text(error)[:2000], finished_at=now, updated_at=now
    ):
        return False
    run.state = state
    live_jobs = list(
        RunStep.objects.filter(run=run, state__in=LIVE_STEP_STATES, job__isnull=False).values_list("job_id", flat=True)
    )
    RunStep.objects.filter(run=run, state__in=LIVE_STEP_STATES).update(state=StepState.CANCELLED, finished_at=now)
    if live_jobs:
        reason = f"run {run.pk} {state}"
        transaction.on_commit(lambda: cancel_jobs(job_ids=live_jobs, reason=reason))
    return True


def cancel_jobs(*, job_ids: list[int], reason: str, actor: str = FLOWS_ACTOR) -> int:
    """Cancel the live ones of these jobs (the engine's cancel: a running body hears it at its
    next heartbeat, ``job_cancelled``, and its late report is refused). Returns how many."""
    cancelled = 0
    for job_id in job_ids:
        try:
            jobs.cancel_job(job_id=job_id, actor=actor, reason=reason)
            cancelled += 1
        except JobStateError:
            pass  # already finished: nothing to stop
    return cancelled


# -- the engine's hook ---------------------------------------------------------------------------------------------


def on_transitions(changes: list[Transition] | Any) -> None:
    """workers.hooks on-transition callback: inside the transaction that changed a step's job.

    A step's completion merges its state delta into the run's state and records its output in
    this transaction (a delta that would make the state larger than MAX_RUN_STATE_BYTES fails the
    step instead: RunStateTooLarge, nothing merged), and makes its dependants due in it too."""
    for change in changes:
        if definitions.is_step_kind(change.kind):
            _step_job_changed(change)


def _step_job_changed(change: Transition) -> None:
    run_id = RunStep.objects.filter(job_id=change.job_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return  # not (or no longer: moved to another version) a step's current job
    run = _locked_run(run_id)
    if run.state in TERMINAL_RUN_STATES:
        return  # the run ended: a late report changes nothing in it
    definition = definitions.get(run.definition, run.version)
    row = RunStep.objects.select_for_update().filter(run=run, job_id=change.job_id).first()
    if definition is None or row is None:
        logger.warning("run %s: no definition %s@%s here; the beat advances it", run.pk, run.definition, run.version)
        return
    now = timezone.now()
    if change.state == JobState.SUCCEEDED:
        merged = decide.merged_state(run.run_state, change.state_delta or {})
        size = json_size(merged)
        if size > MAX_RUN_STATE_BYTES:
            message = f"the run's state would be {size:,} bytes of JSON after this step; the limit is {MAX_RUN_STATE_BYTES:,}"
            transitions.refuse_completion(job_id=change.job_id, error_class="RunStateTooLarge", message=message)
            _move(
                run,
                row.name,
                (StepState.QUEUED, StepState.PARKED),
                StepState.FAILED,
                error_code="run_state_too_large",
                error=message,
                finished_at=now,
            )
        elif _move(
            run,
            row.name,
            (StepState.QUEUED, StepState.PARKED),
            StepState.SUCCEEDED,
            output=change.result,
            state_after=merged,
            finished_at=now,
        ):
            Run.objects.filter(pk=run.pk).update(run_state=merged, updated_at=now)
            run.run_state = merged
    elif change.state in (JobState.FAILED, JobState.CANCELLED):
        found = Job.objects.filter(pk=change.job_id).values("error_class", "error_message", "failure_reason").first()
        job: dict[str, Any] = dict(found) if found else {}
        code = "cancelled" if change.state == JobState.CANCELLED else (job.get("failure_reason") or "failed")
        error = f"{job.get('error_class') or ''}: {job.get('error_message') or ''}".strip(": ")
        _move(
            run,
            row.name,
            (StepState.QUEUED, StepState.PARKED),
            StepState.CANCELLED if change.state == JobState.CANCELLED else StepState.FAILED,
            error_code=code,
            error=error[:2000],
            finished_at=now,
        )
    elif change.state == JobState.PARKED:
        _move(run, row.name, StepState.QUEUED, StepState.PARKED)
    elif change.state == JobState.QUEUED:
        _move(run, row.name, StepState.PARKED, StepState.QUEUED)  # unparked (approved, budget refilled)
    _advance(run, definition)


# -- signals -----------------------------------------------------------------------------------------------------------


def send_signal(*, run_id: int, name: str, key: str, payload: dict[str, Any] | None = None, actor: str) -> SignalAnswer:
    """Deliver the signal ``name`` (deduplicated by ``key``) to run ``run_id``.

    ``resumed``: a wait for it was pending and now has it; ``buffered``: no wait yet, it is kept
    and consumed exactly once when the wait is reached; ``duplicate``: (run, name, key) was sent
    before (nothing changes); ``rejected``: the run has finished. Bad input raises BadSignal,
    SignalTooLarge or TooManyPendingSignals, UnknownRun for no such run; nothing is written then.
    """
    payload = {} if payload is None else payload
    if not isinstance(name, str) or not 0 < len(name) <= 100:
        raise BadSignal("name must be 1 to 100 characters")
    if not isinstance(key, str) or not 0 < len(key) <= 200:
        raise BadSignal("key must be 1 to 200 characters")
    if not isinstance(payload, dict):
        raise BadSignal(f"payload must be a JSON object, not {type(payload).__name__}")
    try:
        size = json_size(payload)
    except (TypeError, ValueError) as exc:
        raise BadSignal(f"payload is not storable JSON: {exc}") from None
    if size > MAX_SIGNAL_PAYLOAD_BYTES:
        raise SignalTooLarge(f"the payload is {size:,} bytes of JSON; the limit is {MAX_SIGNAL_PAYLOAD_BYTES:,}")
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.state in TERMINAL_RUN_STATES:
            return SignalAnswer(outcome="rejected", signal_id=None)
        earlier = Signal.objects.filter(run=run, name=name, key=key).values_list("pk", flat=True).first()
        if earlier is not None:
            return SignalAnswer(outcome="duplicate", signal_id=earlier)
        if Signal.objects.filter(run=run, status=SignalStatus.BUFFERED).count() >= MAX_PENDING_SIGNALS:
            raise TooManyPendingSignals(f"run {run.pk} already holds {MAX_PENDING_SIGNALS} unconsumed signals")
        signal = Signal.objects.create(run=run, name=name, key=key, payload=payload, sent_by=actor)
        record_audit(
            actor=actor, action=AuditAction.RUN_SIGNAL, target_type="run", target_id=run.pk, details={"name": name, "key": key}
        )
        definition = definitions.get(run.definition, run.version)
        waiting = RunStep.objects.filter(run=run, state=StepState.WAITING).order_by("id")
        for row in waiting:
            step = definition.steps.get(row.name) if definition else None
            if step is not None and step.wait is not None and step.wait.event == name and _resolve_wait(run, step, signal):
                assert definition is not None
                _advance(run, definition)
                return SignalAnswer(outcome="resumed", signal_id=signal.pk)
        return SignalAnswer(outcome="buffered", signal_id=signal.pk)


# -- cancel, move -------------------------------------------------------------------------------------------------------


def cancel_run(*, run_id: int, actor: str, reason: str = "") -> Run:
    """Cancel a live run: its pending and waiting steps end, its queued steps' jobs are cancelled
    and its running ones are told through their heartbeat (``job_cancelled``); a late report of
    one is refused by name and changes nothing. RunFinished when it has already ended."""
    reason = redact_text(reason or "")[:500]
    with transaction.atomic():
        # The live steps' jobs first, in id order, then the run: the order a step's ending takes
        # (its job, then the run). Holding them, no completion can land between the run's end and
        # theirs (accepted on the job, ignored by the cancelled run): a report either ended before
        # this (and the run recorded it) or comes after and is refused by name (job_cancelled).
        held = _lock_live_jobs(run_id)
        run = _locked_run(run_id)
        if run.state in TERMINAL_RUN_STATES:
            raise RunFinished(f"run {run.pk} is already {run.state}; a finished run never changes")
        record_audit(
            actor=actor, action=AuditAction.RUN_CANCEL, target_type="run", target_id=run.pk, details={"reason": reason[:200]}
        )
        _finish(run, RunState.CANCELLED, code="cancelled", error=f"cancelled by {actor}" + (f": {reason}" if reason else ""))
        # The held ones end here; a step made due after the read above (none can be once the run
        # is locked and cancelled) would be left to _finish's after-commit cancel.
        cancel_jobs(job_ids=held, reason=f"run {run.pk} cancelled")
    run.refresh_from_db()
    return run


def _lock_live_jobs(run_id: int) -> list[int]:
    """Lock the live jobs of a run's live steps (id order, like every multi-job lock) and return
    their ids; a job that ended meanwhile is left out."""
    job_ids = sorted(
        RunStep.objects.filter(run_id=run_id, state__in=LIVE_STEP_STATES, job__isnull=False).values_list("job_id", flat=True)
    )
    if not job_ids:
        return []
    return list(
        Job.objects.select_for_update()
        .filter(pk__in=job_ids)
        .exclude(state__in=TERMINAL_STATES)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def move_to_version(*, run_id: int, to_version: int, actor: str) -> Run:
    """Pin a live run to version ``to_version`` of its definition (an audited action for runs
    stranded on a version no live worker serves). It takes effect at the run's next step: steps
    enqueued from now on are of the new version, and a step whose job is still queued (no
    attempt started) is enqueued again at it; a running step finishes at its own version."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.state in TERMINAL_RUN_STATES:
            raise RunFinished(f"run {run.pk} is already {run.state}; a finished run never changes")
        target = definition_of(run.definition, to_version)
        current = definitions.get(run.definition, run.version)
        if current is not None and set(current.steps) != set(target.steps):
            raise UnknownVersion(
                f"{target.key} has other steps than {run.definition}@{run.version}; a run moves only between versions "
                "with the same steps"
            )
        previous = run.version
        Run.objects.filter(pk=run.pk).update(version=to_version, updated_at=timezone.now())
        run.version = to_version
        record_audit(
            actor=actor,
            action=AuditAction.RUN_MOVE,
            target_type="run",
            target_id=run.pk,
            details={"from_version": previous, "to_version": to_version},
        )
        for row in RunStep.objects.filter(run=run, state=StepState.QUEUED, job__isnull=False).exclude(version=to_version):
            # SKIP LOCKED: a job row someone holds is being claimed or ended; that step keeps its
            # version (waiting for the job's lock here could deadlock with its ending, which holds
            # the job and waits for this run).
            job = Job.objects.select_for_update(skip_locked=True).filter(pk=row.job_id or 0, state=JobState.QUEUED).first()
            if job is None:
                continue
            # Detach first, so the hook told of the cancel finds no step for the old job.
            RunStep.objects.filter(pk=row.pk).update(state=StepState.PENDING, job=None, version=None, due_at=None)
            jobs.cancel_job(job_id=job.pk, actor=actor, reason=f"run {run.pk} moved to version {to_version}")
        _advance(run, target)
    run.refresh_from_db()
    return run


# -- the beat --------------------------------------------------------------------------------------------------------------


def expire_waits() -> int:
    """Resolve the waits past their timeout by their ``on_timeout``: ``continue`` gives the next
    step ``{"timed_out": True}``, ``skip`` skips the wait (its dependants follow their edges),
    ``fail`` fails it. Returns how many waits it resolved."""
    resolved = 0
    due = list(
        RunStep.objects.filter(state=StepState.WAITING, wait_deadline__lte=timezone.now()).values_list("run_id", "name")[:500]
    )
    for run_id, name in due:
        with transaction.atomic():
            run = _locked_run(run_id)
            definition = definitions.get(run.definition, run.version)
            if run.state in TERMINAL_RUN_STATES or definition is None or name not in definition.steps:
                continue
            step = definition.steps[name]
            assert step.wait is not None
            now = timezone.now()
            match step.wait.on_timeout:
                case OnTimeout.CONTINUE:
                    moved = _move(
                        run,
                        name,
                        StepState.WAITING,
                        StepState.SUCCEEDED,
                        output={"timed_out": True},
                        state_after=run.run_state,
                        finished_at=now,
                    )
                case OnTimeout.SKIP:
                    moved = _move(run, name, StepState.WAITING, StepState.SKIPPED, output={"timed_out": True}, finished_at=now)
                case _:
                    moved = _move(
                        run,
                        name,
                        StepState.WAITING,
                        StepState.FAILED,
                        error_code="wait_timed_out",
                        error=f"no {step.wait.event!r} signal within {step.wait.timeout_seconds:g}s",
                        finished_at=now,
                    )
            if moved:
                resolved += 1
                _advance(run, definition)
    return resolved


def sweep_ended_runs() -> int:
    """Cancel the live jobs of ended runs that a crash left (the on-commit cancel never ran)."""
    job_ids = list(
        RunStep.objects.filter(
            run__state__in=TERMINAL_RUN_STATES, job__state__in=[JobState.QUEUED, JobState.RUNNING, JobState.PARKED]
        ).values_list("job_id", flat=True)[:500]
    )
    return cancel_jobs(job_ids=[j for j in job_ids if j is not None], reason="its run has ended")


def beat() -> dict[str, int]:
    """The beat's housekeeping for runs (workers.hooks beat task)."""
    return {"waits_expired": expire_waits(), "ended_runs_jobs_cancelled": sweep_ended_runs()}


# -- a person's read ----------------------------------------------------------------------------------------------------


def read_run(*, run_id: int, actor: str) -> Any:
    """A person reads a run's journal (``selectors.run_view``): the read is audited (a READ row
    in the same transaction); the machine loop never calls this. UnknownRun for no such run."""
    from flows import selectors

    with transaction.atomic():
        view = selectors.run_view(run_id)
        if view is None:
            raise UnknownRun(f"no run {run_id!r}")
        record_audit(actor=actor, action=AuditAction.READ, target_type="run", target_id=run_id)
    return view


# -- retention (workers.hooks.register_retention) -----------------------------------------------------------------------


def keep_jobs_of_live_runs(job_ids: Sequence[int], cutoff: datetime) -> set[int]:
    """Inside a prune batch: a step's job stays while its run is live, or finished after the cutoff
    (a young run's journal shows every step, however old its first steps' jobs)."""
    keeping = Run.objects.filter(Q(state__in=LIVE_RUN_STATES) | Q(finished_at__gte=cutoff)).values("id")
    return set(Job.objects.filter(id__in=list(job_ids), run_id__in=keeping).values_list("id", flat=True))


def forget_jobs_of_runs(job_ids: Sequence[int]) -> int:
    """Inside a prune batch, before the engine deletes ``job_ids``: a finished run none of whose
    other jobs remain goes with them (its steps and signals too: on_delete CASCADE); a run that
    keeps other jobs (one an open operation pins) keeps its steps, whose link to a pruned job is
    set NULL (on_delete SET_NULL). Rows deleted or detached."""
    ids = list(job_ids)
    run_ids: set[int] = {
        run_id for run_id in Job.objects.filter(id__in=ids).values_list("run_id", flat=True) if run_id is not None
    }
    run_ids |= set(RunStep.objects.filter(job_id__in=ids).values_list("run_id", flat=True))
    if not run_ids:
        return 0
    others = Job.objects.filter(run_id=OuterRef("id")).exclude(id__in=ids)
    ending = Run.objects.filter(id__in=run_ids, state__in=TERMINAL_RUN_STATES).exclude(Exists(others))
    deleted, _ = ending.delete()
    detached = RunStep.objects.filter(job_id__in=ids).update(job=None)
    return deleted + detached
