"""The worker runtime: the RQ entry, the job context and the heartbeat thread.

An RQ message is a doorbell naming one job. ``deliver`` claims that job (a
duplicate delivery finds it taken and does nothing), runs it, then claims and
runs a bounded batch of further due jobs from PostgreSQL before returning to RQ.
RQ's own Retry is never used: retries are database state (scheduled_at).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from koala import redaction
from koala.redaction import redact_text
from workers import doorbell, kinds
from workers.errors import (
    AttemptTimeout,
    Interrupted,
    Park,
    Paused,
    ReconcileLater,
    Rejection,
    Retryable,
    StaleAttempt,
    TerminalFailure,
)
from workers.models import Attempt, Delivery, FailureReason, Operation, Outcome, operation_key_base
from workers.services import budgets, leases, pauses
from workers.services.budgets import ClaimBlocked
from workers.services.leases import Lease, Report

log = logging.getLogger("koala.worker")

UNSERVABLE_MAX_DELAY = 30.0  # seconds; a job nobody here serves is retried at most this rarely


class JobContext:
    """What a body gets besides its input: signals, checkpoints, state and usage.

    ``cancelled`` is set when the lease is lost, the job is cancelled, a stop-mode pause
    covers it, or the run's time is up; a long body should call ``checkpoint()`` between
    steps, which raises the right exception for the runtime to act on.
    """

    def __init__(self, lease: Lease, kind: kinds.JobKind, runtime: WorkerRuntime) -> None:
        self.lease = lease
        self.kind = kind
        self.job_id = lease.job_id
        self.attempt_id = lease.attempt_id
        self.created_by = lease.created_by
        self.attempt = lease.attempts
        self.input = lease.input
        # What this attempt masks in every sink (bound by the runtime around the body and its
        # reports): the kind's sensitive fields and their values in the input.
        self.redactor = kind.redactor(lease.input)
        self.run_state = lease.run_state
        self.previous_progress = lease.progress
        self.correlation_id = lease.correlation_id
        self.trace_id = lease.trace_id
        # Stable across retries of this job, and carried by an operator retry from its original
        # (Job.operation_key_base): the idempotency key for outbound calls, so a retry's steps
        # find the original's ledger rows and can never send an effect twice.
        self.idempotency_key = operation_key_base(
            job_id=lease.job_id, idempotency_key=lease.idempotency_key, carried=lease.operation_key_base
        )
        self.worker_name = runtime.name
        self.cancelled = threading.Event()
        self.shutting_down = runtime.shutdown_requested
        self.rejection: Rejection | None = None
        self.state_delta: dict[str, Any] = {}
        self.usage: dict[str, float] = {}
        self.waits = {"db": 0.0, "storage": 0.0}
        self._pending_progress: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._runtime = runtime
        now = time.monotonic()
        self.time_limit_at: float | None = now + lease.timeout_seconds
        self.deadline_at: float | None = now + (lease.deadline_at - timezone.now()).total_seconds() if lease.deadline_at else None
        self.stale_stop_at: float | None = None
        self.paused = False  # a stop-mode pause covers this job: release it at the next safe point
        self.pause_stop_at: float | None = None
        self.last_beat_at = now

    # -- body API ----------------------------------------------------------------
    def progress(self, **checkpoint: Any) -> None:
        """Store a checkpoint with the next heartbeat (a retry finds it in previous_progress)."""
        with self._lock:
            self._pending_progress = checkpoint

    def heartbeat(self) -> None:
        """Heartbeat now (e.g. between long batches) and raise StaleAttempt if the lease is gone."""
        self._runtime.beat(self)
        self.checkpoint()

    def confirm_lease(self) -> None:
        """Renew the lease now and raise StaleAttempt if it is gone (the ledger calls this right
        before each outbound call). A database error propagates: without a confirmed lease
        nothing may be sent."""
        rejection = leases.heartbeat(
            job_id=self.job_id, lease_token=self.lease.lease_token, lease_seconds=self._runtime.lease_seconds
        )
        if rejection is not None:
            self.reject(rejection)
            raise StaleAttempt(rejection)
        self.last_beat_at = time.monotonic()

    def checkpoint(self) -> None:
        """Raise StaleAttempt if this attempt may no longer act, Paused if a stop pause covers it."""
        if self.rejection is not None:
            raise StaleAttempt(self.rejection)
        if self.paused:
            raise Paused("a stop-mode pause covers this job")

    def operation(self, name: str, **options: Any) -> dict[str, Any]:
        """Run one outbound side effect through the operations ledger (see workers.operations).

        Returns the result's data; a re-run after success returns the stored data without
        calling out. Raises Park (review, needs attention, budget) for the runtime to handle.
        """
        from workers.operations import run_operation

        self.checkpoint()
        return run_operation(self, name, **options)

    def operation_key(self, name: str) -> str:
        """The default key of step ``name``: stable across retries, unique per job and step."""
        return f"{self.idempotency_key}:{name}"

    def previous_operation(self, name: str, *, key: str | None = None) -> Operation | None:
        """The stored ledger row of step ``name`` (any state), e.g. the params of a crashed publish."""
        return Operation.objects.filter(key=key or self.operation_key(name)).first()

    def set_state(self, **delta: Any) -> None:
        """Top-level keys merged into the run's state when the attempt completes."""
        self.state_delta.update(delta)

    def add_usage(self, **amounts: float) -> None:
        for key, amount in amounts.items():
            self.usage[key] = self.usage.get(key, 0) + amount

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Attribute the time inside to ``db`` or ``storage`` wait instead of compute."""
        if what not in self.waits:
            raise ValueError("waiting() takes 'db' or 'storage'")
        started = time.monotonic()
        try:
            yield
        finally:
            self.waits[what] += time.monotonic() - started

    # -- runtime side ------------------------------------------------------------
    def take_progress(self) -> dict[str, Any] | None:
        with self._lock:
            pending, self._pending_progress = self._pending_progress, None
        return pending

    def reject(self, rejection: Rejection) -> None:
        self.rejection = rejection
        self.cancelled.set()


class WorkerRuntime:
    """Per-process state: who we are, what we serve, the current attempt, shutdown."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.name = f"{socket.gethostname()}.{self.pid}"
        self.queues: list[str] | None = None
        self.shutdown_requested = threading.Event()
        self.shutdown_deadline: float | None = None
        self.current: JobContext | None = None
        # Alarm bookkeeping. The lock is re-entrant because signal handlers (SIGTERM)
        # run on the main thread and may interrupt it while it holds the lock.
        self._alarm_lock = threading.RLock()
        self._alarm_enabled = False  # our SIGALRM handler is installed (main thread, inside deliver)
        self._in_body = False
        self._alarm_reason = ""
        self._heartbeat: threading.Thread | None = None

    def configure(self, *, name: str, queues: list[str]) -> None:
        self.name = name
        self.queues = list(queues)

    @property
    def lease_seconds(self) -> float:
        return float(settings.KOALA_LEASE_SECONDS)

    # -- shutdown and time limits --------------------------------------------------
    def request_shutdown(self, deadline_seconds: float | None = None) -> None:
        """Stop claiming; the running body gets until the deadline, then is released."""
        if self.shutdown_requested.is_set():
            return
        seconds = settings.KOALA_SHUTDOWN_DEADLINE_SECONDS if deadline_seconds is None else deadline_seconds
        self.shutdown_deadline = time.monotonic() + seconds
        self.shutdown_requested.set()
        self._rearm()

    def _rearm(self) -> None:
        """Arm SIGALRM for the nearest of: attempt limit, job deadline, shutdown deadline, stale stop.

        Only while a body runs: an alarm can then never fire into Koala's own
        reporting code, nor after deliver() has put back the previous handler.
        """
        with self._alarm_lock:
            ctx = self.current
            if not (self._alarm_enabled and self._in_body and ctx is not None):
                return
            candidates = [
                (ctx.time_limit_at, "timeout"),
                (ctx.deadline_at, "deadline"),
                (ctx.stale_stop_at, "stale"),
                (ctx.pause_stop_at, "paused"),
            ]
            if self.shutdown_deadline is not None:
                candidates.append((self.shutdown_deadline, "shutdown"))
            at, reason = min(((t, r) for t, r in candidates if t is not None), key=lambda c: c[0])
            self._alarm_reason = reason
            signal.setitimer(signal.ITIMER_REAL, max(at - time.monotonic(), 0.001))

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self._in_body:
            raise Interrupted(self._alarm_reason)

    @contextmanager
    def _alarms(self) -> Iterator[None]:
        if not _in_main_thread():  # signals only reach the main thread; limits are then cooperative
            yield
            return
        previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self._alarm_enabled = True
        try:
            yield
        finally:
            with self._alarm_lock:
                self._alarm_enabled = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    # -- heartbeat ---------------------------------------------------------------
    def ensure_heartbeat(self) -> None:
        if self.pid != os.getpid():  # a forked work horse: threads do not survive fork
            self.pid = os.getpid()
            self._heartbeat = None
        if self._heartbeat is None or not self._heartbeat.is_alive():
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="koala-heartbeat", daemon=True)
            self._heartbeat.start()

    def _heartbeat_loop(self) -> None:
        # Polls often but writes only when the current attempt's beat is due, so a
        # new attempt never waits out a long sleep begun during the previous one.
        while True:
            interval = float(settings.KOALA_HEARTBEAT_SECONDS)
            time.sleep(min(interval, 0.25))
            ctx = self.current
            if ctx is None:
                # Idle: hold no database session (lets a deploy or test drop the database).
                connection.close()
                continue
            if ctx.rejection is None and time.monotonic() - ctx.last_beat_at >= interval:
                ctx.last_beat_at = time.monotonic()
                self.beat(ctx)

    def beat(self, ctx: JobContext) -> None:
        try:
            rejection = leases.heartbeat(
                job_id=ctx.job_id,
                lease_token=ctx.lease.lease_token,
                lease_seconds=self.lease_seconds,
                progress=ctx.take_progress(),
            )
        except (OperationalError, InterfaceError) as exc:
            # The database is unreachable: keep the body going; if this lasts past the
            # lease, the next successful call reports lease_expired and we stop then.
            log.warning("heartbeat for job %s failed: %s", ctx.job_id, type(exc).__name__)
            connection.close()
            return
        if rejection is not None and self.current is not ctx:
            # The body ended while this heartbeat was in flight: its own report (or the
            # report's rejection, handled by name there) decides; there is no body to stop.
            return
        if rejection is not None:
            log.warning("job %s attempt %s: heartbeat rejected (%s); stopping the body", ctx.job_id, ctx.attempt, rejection.value)
            ctx.reject(rejection)
            # A body that ignores ctx.cancelled is interrupted one heartbeat later.
            ctx.stale_stop_at = time.monotonic() + float(settings.KOALA_HEARTBEAT_SECONDS)
            self._rearm()
            return
        if ctx.paused:
            return
        try:
            stop = pauses.stop_requested(kind=ctx.lease.kind, queue=ctx.lease.queue)
        except (OperationalError, InterfaceError):
            connection.close()
            return
        if stop and self.current is ctx:
            log.warning("job %s attempt %s: a stop pause covers it; cancelling the body", ctx.job_id, ctx.attempt)
            ctx.paused = True
            ctx.cancelled.set()
            ctx.pause_stop_at = time.monotonic() + float(settings.KOALA_HEARTBEAT_SECONDS)
            self._rearm()

    # -- running jobs ------------------------------------------------------------
    def run(self, lease: Lease) -> None:
        kind = kinds.get(lease.kind, lease.version)
        if kind is None:
            log.info("job %s: %s@%s is not served here; returning it to the queue", lease.job_id, lease.kind, lease.version)
            # Back off while no worker serving it shows up (an old worker alone during a deploy),
            # so the attempt log grows by a few rows per minute, not one per second.
            earlier = Attempt.objects.filter(job_id=lease.job_id, outcome=Outcome.UNSERVABLE).count()
            delay = min(UNSERVABLE_MAX_DELAY, 0.5 * 2**earlier)
            self._report(
                lease,
                Outcome.UNSERVABLE,
                leases.release,
                outcome=Outcome.UNSERVABLE,
                message=f"worker {self.name} does not serve {lease.kind}@{lease.version}",
                delay_seconds=delay,
            )
            return
        ctx = JobContext(lease, kind, self)
        # One redaction context for the whole attempt: the body's log records and Sentry events,
        # and every message the reports below store, mask the job's declared values.
        with redaction.bind(ctx.redactor):
            self._attempt(ctx, kind)

    def _attempt(self, ctx: JobContext, kind: kinds.JobKind) -> None:
        lease = ctx.lease
        started = time.monotonic()
        outcome: tuple[str, Any] = ("ok", None)
        try:
            with self._alarm_lock:
                self.current = ctx
                self._in_body = True
            self._rearm()
            try:
                outcome = ("ok", kind.body(ctx, dict(lease.input)))
            finally:
                with self._alarm_lock:
                    self._in_body = False
                    if self._alarm_enabled:
                        signal.setitimer(signal.ITIMER_REAL, 0)
        except Interrupted as exc:
            outcome = ("interrupted", exc.why)
        except Paused:
            outcome = ("paused", None)
        except Park as exc:
            outcome = ("park", exc)
        except StaleAttempt as exc:
            outcome = ("stale", exc.rejection)
        except Exception as exc:
            outcome = ("error", exc)
        finally:
            self.current = None
        elapsed = time.monotonic() - started
        report = Report(
            compute_seconds=max(elapsed - ctx.waits["db"] - ctx.waits["storage"], 0.0),
            db_wait_seconds=ctx.waits["db"],
            storage_wait_seconds=ctx.waits["storage"],
            usage=ctx.usage or None,
        )
        self._settle(ctx, kind, outcome, report)
        if lease.budget_usage_ids:
            try:
                budgets.add_run_seconds(usage_ids=lease.budget_usage_ids, seconds=elapsed)
            except (OperationalError, InterfaceError):
                connection.close()  # run time is advisory accounting; losing one sample is acceptable

    def _settle(self, ctx: JobContext, kind: kinds.JobKind, outcome: tuple[str, Any], report: Report) -> None:
        lease = ctx.lease
        what, value = outcome
        if ctx.rejection is not None and what != "ok":
            # The engine already told us this attempt is stale: nothing it says may count.
            log.info("job %s attempt %s stopped after rejection %s", lease.job_id, ctx.attempt, ctx.rejection.value)
            return
        if what == "stale":
            return
        if what == "ok":
            self._report(lease, Outcome.SUCCEEDED, leases.complete, result=value, state_delta=ctx.state_delta, report=report)
            return
        if what == "park" and isinstance(value, ReconcileLater):
            # An operation's outcome is still open and the provider may settle it soon: give the
            # job back without using an attempt; the ledger bounds how long this goes on.
            log.info("job %s waits %.1fs to reconcile: %s", lease.job_id, value.delay_seconds, value.detail)
            self._report(
                lease,
                Outcome.INTERRUPTED,
                leases.release,
                outcome=Outcome.INTERRUPTED,
                message=redact_text(value.detail),
                delay_seconds=value.delay_seconds,
            )
            return
        if what == "park":
            log.info("job %s parked (%s): %s", lease.job_id, value.reason, value.detail)
            self._report(
                lease,
                Outcome.PARKED,
                leases.park,
                reason=value.reason,
                detail=value.detail,
                parked_on=value.parked_on,
                report=report,
            )
            return
        if what == "paused":
            # The body stopped at a safe point (checkpoint): give the job back, no attempt used.
            self._report(
                lease, Outcome.INTERRUPTED, leases.release, outcome=Outcome.INTERRUPTED, message="released by a stop pause"
            )
            return
        if what == "interrupted" and value == "paused":
            value = "shutdown"  # cut off mid-body by a stop pause: exactly the shutdown case below
        if what == "interrupted" and value == "shutdown" and lease.delivery == Delivery.AT_MOST_ONCE:
            # The body was cut off mid-way and may already have had its effect. Releasing it
            # would run it a second time: at_most_once fails instead, as the reaper does.
            self._report(
                lease,
                Outcome.FAILED,
                leases.fail,
                reason=FailureReason.ORPHANED,
                error_class="Interrupted",
                message="interrupted at the worker's shutdown deadline; at_most_once does not run a body twice",
                report=report,
            )
            return
        if what == "interrupted" and value == "shutdown":
            self._report(
                lease,
                Outcome.INTERRUPTED,
                leases.release,
                outcome=Outcome.INTERRUPTED,
                message="released at worker shutdown deadline",
            )
            return
        if what == "interrupted" and value == "deadline":
            error: BaseException = TerminalFailure("the job's overall deadline passed during the attempt")
            reason = FailureReason.DEADLINE_EXCEEDED
        elif what == "interrupted":
            error = AttemptTimeout(f"attempt exceeded its time limit of {lease.timeout_seconds:g}s")
            reason = FailureReason.FATAL
        elif isinstance(value, OperationalError | InterfaceError):
            # The body lost the database (a partition, a session the server ended for idling in
            # a transaction, a failover): transient by nature, and nothing after it was recorded.
            error = Retryable(f"database connection lost during the attempt ({type(value).__name__})")
            reason = FailureReason.FATAL
            connection.close()
        else:
            error = value
            reason = FailureReason.TERMINAL if isinstance(error, TerminalFailure) else FailureReason.FATAL
        error_class = type(error).__name__
        if isinstance(error, TerminalFailure) and error.code != "terminal":
            error_class = f"{error_class}:{error.code}"
        message = redact_text(str(error))
        if isinstance(error, Retryable):
            if lease.attempts < lease.max_attempts:
                delay = error.retry_after if error.retry_after is not None else kind.backoff_seconds(lease.attempts)
                self._report(
                    lease,
                    Outcome.RETRY,
                    leases.retry_later,
                    delay_seconds=delay,
                    error_class=error_class,
                    message=message,
                    report=report,
                )
                return
            reason = FailureReason.ATTEMPTS_EXHAUSTED
        self._report(
            lease,
            Outcome.FAILED,
            leases.fail,
            reason=reason,
            error_class=error_class,
            message=message,
            report=report,
        )

    def _report(self, lease: Lease, reporting: str, service: Callable[..., Rejection | None], **fields: Any) -> Rejection | None:
        """Call a fenced lease service for this attempt, retrying through a dropped connection,
        and handle each rejection by name."""
        rejection: Rejection | None = None
        for attempt in range(4):
            try:
                rejection = service(job_id=lease.job_id, lease_token=lease.lease_token, **fields)
                break
            except (OperationalError, InterfaceError) as exc:
                # The commit may or may not have happened; the repeat answers already_recorded if it did.
                log.warning("job %s: reporting %s failed (%s); retrying", lease.job_id, reporting, type(exc).__name__)
                connection.close()
                time.sleep(0.2 * 2**attempt)
        else:
            log.error("job %s: could not report %s; the lease will expire and the reaper decides", lease.job_id, reporting)
            return None
        if rejection is None or rejection is Rejection.ALREADY_RECORDED:
            return rejection  # already_recorded: our earlier report landed; that is success
        if rejection is Rejection.JOB_CANCELLED:
            log.info("job %s was cancelled while running; its %s report was discarded", lease.job_id, reporting)
        elif rejection is Rejection.LEASE_SUPERSEDED:
            log.warning("job %s is owned by a newer attempt; this attempt's %s report was discarded", lease.job_id, reporting)
        elif rejection is Rejection.LEASE_EXPIRED:
            log.warning("job %s: lease expired before the %s report; the reaper requeues or fails it", lease.job_id, reporting)
        return rejection

    def drain(self, *, first_job_id: int | None, origin_queue: str) -> int:
        """Claim and run the named job, then further due jobs, within the batch bounds."""
        self.ensure_heartbeat()
        with self._alarms():
            return self._drain(first_job_id=first_job_id, origin_queue=origin_queue)

    def _drain(self, *, first_job_id: int | None, origin_queue: str) -> int:
        served = [k.key for k in kinds.served()]
        queues = self.queues or [origin_queue]
        batch = int(settings.KOALA_DRAIN_BATCH)
        stop_at = time.monotonic() + float(settings.KOALA_DRAIN_SECONDS)
        ran = 0
        # Read once per pass (at most KOALA_DRAIN_BATCH jobs or KOALA_DRAIN_SECONDS): whether any
        # budget gates claims, so the common case claims in one statement; a budget created
        # meanwhile applies from the next pass. Spend and requests are reserved per call and
        # never depend on this.
        gated = budgets.claims_are_gated()
        if first_job_id is not None and not self.shutdown_requested.is_set():
            lease = leases.claim_job(
                job_id=first_job_id, worker=self.name, lease_seconds=self.lease_seconds, served=served, gated=gated
            )
            if lease is not None:
                self.run(lease)
                ran += 1
            else:
                # The doorbell may have been for a version we lack (a rolling deploy): we never
                # claim such a job, but the message was meant for a worker that has it. Pass it
                # on while one is live, at most once per live worker that lacks it (see
                # doorbell.pass_on for why that reaches a waiting capable worker).
                hops = doorbell.hops()
                missed = leases.misdelivered(job_id=first_job_id, served=served, live_seconds=self.lease_seconds)
                if missed is not None and missed.capable and hops < missed.incapable:
                    doorbell.pass_on(missed.queue, first_job_id, missed.version, hops=hops + 1)
        exhausted = False
        # The claim statement is the authority on pauses; knowing them up front only spares it
        # from walking past a paused kind's backlog on every claim (11 -> 5 ms per claim with
        # 20,000 paused jobs at the head of the queue).
        live = pauses.active_pauses()
        paused_kinds = [p.target for p in live if p.scope == "kind"]
        skip: dict[str, list[str]] = {q: list(paused_kinds) for q in queues}  # paused kinds, full concurrency scopes
        # Queues not to claim from in this pass: paused (globally or by queue), or a full concurrency scope.
        blocked: set[str] = {q for q in queues if any(p.scope == "global" or p.target == q for p in live if p.scope != "kind")}
        while ran < batch and time.monotonic() < stop_at and not self.shutdown_requested.is_set():
            lease = None
            for queue in queues:
                while queue not in blocked:
                    try:
                        lease = leases.claim_next(
                            queue=queue,
                            served=served,
                            worker=self.name,
                            lease_seconds=self.lease_seconds,
                            skip_kinds=skip[queue],
                            gated=gated,
                        )
                    except ClaimBlocked as full:
                        # Leave that job queued; whoever frees a slot (or the beat) rings again.
                        if full.scope == "kind":
                            skip[queue].append(full.target)
                        else:
                            blocked.add(queue)
                        continue
                    break
                if lease is not None:
                    break
            if lease is None:
                exhausted = True
                break
            self.run(lease)
            ran += 1
        if not exhausted and not self.shutdown_requested.is_set():
            # We stopped at the batch bound with work possibly left: ring so it continues.
            from workers.services.maintenance import dispatch

            dispatch()
        return ran


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


_runtime: WorkerRuntime | None = None


def get_runtime() -> WorkerRuntime:
    global _runtime
    if _runtime is None:
        _runtime = WorkerRuntime()
    return _runtime


def deliver(job_id: int, version: int) -> int:
    """The RQ entry. The message names a job and its contract version; nothing else.

    Returns the number of jobs run. Never raises for a job's own failure: outcomes
    are database state, and RQ's failure registry is not Koala's record.
    """
    close_old_connections()
    from rq import get_current_job

    current = get_current_job()
    origin = current.origin if current is not None else "default"
    runtime = get_runtime()
    if runtime.queues is None and current is not None and current.worker_name:
        runtime.name = current.worker_name
    return runtime.drain(first_job_id=job_id, origin_queue=origin)
