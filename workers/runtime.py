"""The worker runtime: the RQ entry, the alarms, the heartbeat thread, and recording how attempts end.

An RQ message is a doorbell naming one job. ``deliver`` claims that job (a
duplicate delivery finds it taken and does nothing), runs it, then claims and
runs a bounded batch of further due jobs from PostgreSQL before returning to RQ.
RQ's own Retry is never used: retries are database state (scheduled_at).

Each attempt ends in three steps (docs/engine.md, "How an attempt ends"): ``_run_body`` says
how the body ended (an ``outcomes`` ending), ``outcomes.decide`` picks the one lease
transition that records it, and ``_report`` has the one transition writer
(``workers.transitions.end_attempt``, which the HTTP protocol uses too) record it, retrying
through a dropped connection and logging the line a person reads (``transitions.log_outcome``).
In a fork worker's work horse each body runs under its kind's memory and CPU ceilings
(workers.bounds). The body API (``ctx``) is workers.context.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from koala import redaction
from workers import bounds, doorbell, hooks, kinds, outcomes, transitions
from workers.bounds import get_bounds
from workers.context import JobContext
from workers.errors import Interrupted, Park, Paused, ReconcileLater, Rejection, StaleAttempt
from workers.models import Delivery
from workers.services import leases, pauses
from workers.services.leases import ClaimPass, Lease
from workers.transitions import Report

log = logging.getLogger("koala.worker")


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
        # The batch (docs/engine.md, "Batch claims"): leases claimed and not started yet (they
        # wait their turn), and completions recorded in memory, written together by _flush. Both
        # are held leases the heartbeat thread keeps alive; _held_lock guards them across threads.
        self._held_lock = threading.Lock()
        self._waiting: list[Lease] = []
        self._lost: set[int] = set()  # job ids of waiting leases a heartbeat found taken
        self._done: list[_Done] = []
        self._held_beat_at = 0.0
        self._done_since = 0.0

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
            self._keep_held(interval)
            ctx = self.current
            if ctx is None:
                # Idle: hold no database session (lets a deploy or test drop the database).
                connection.close()
                continue
            if ctx.rejection is None and time.monotonic() - ctx.last_beat_at >= interval:
                ctx.last_beat_at = time.monotonic()
                self.beat(ctx)

    def _keep_held(self, interval: float) -> None:
        """Heartbeat thread: keep the batch's held leases (waiting their turn, or completed and
        waiting for the batch's write) alive, and write completions that have waited longer than
        KOALA_BATCH_COMPLETE_SECONDS (a long body later in the batch must not hold them back)."""
        now = time.monotonic()
        with self._held_lock:
            done_due = bool(self._done) and now - self._done_since >= float(settings.KOALA_BATCH_COMPLETE_SECONDS)
            held = [*self._waiting, *(d.ending.lease for d in self._done)] if now - self._held_beat_at >= interval else []
        if done_due:
            self._flush()
        if not held:
            return
        self._held_beat_at = now
        try:
            live = leases.heartbeat_many(held=held, lease_seconds=self.lease_seconds)
        except (OperationalError, InterfaceError) as exc:
            log.warning("heartbeat for %d held jobs failed: %s", len(held), type(exc).__name__)
            connection.close()
            return
        lost = {lease.job_id for lease in held} - live
        if lost:
            with self._held_lock:
                self._lost |= lost  # a waiting one is skipped; a completed one's write is refused
            log.warning("jobs %s: their held leases were lost while waiting in the batch", sorted(lost))

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
            stop = pauses.stop_requested(kind=ctx.lease.kind, queue=ctx.lease.queue, tenant=ctx.lease.tenant)
        except (OperationalError, InterfaceError):
            connection.close()
            return
        if stop and self.current is ctx:
            log.warning("job %s attempt %s: a stop pause covers it; cancelling the body", ctx.job_id, ctx.attempt)
            ctx.paused = True
            hooks.count_rejection("paused")  # a stop pause refuses the running body
            ctx.cancelled.set()
            ctx.pause_stop_at = time.monotonic() + float(settings.KOALA_HEARTBEAT_SECONDS)
            self._rearm()

    # -- running jobs ------------------------------------------------------------
    def run(self, lease: Lease) -> None:
        """Run one claimed attempt to its end, then record that end: ending → decide → _report."""
        kind = kinds.get(lease.kind, lease.version)
        if kind is None or kind.remote:
            # Back off while no worker serving it shows up (an old worker alone during a deploy).
            self._report(lease, transitions.unservable(lease, worker=self.name))
            return
        self.ensure_heartbeat()  # a thread that died (say, of a body's MemoryError) comes back
        ctx = JobContext(lease, kind, self)
        # One redaction context for the whole attempt: the body's log records and Sentry events,
        # and every message the report below stores, mask the job's declared values.
        with redaction.bind(ctx.redactor):
            self._attempt(ctx, kind)

    def _attempt(self, ctx: JobContext, kind: kinds.JobKind) -> None:
        lease = ctx.lease
        log.debug("job %s (%s, attempt %s, queue %s) started", lease.job_id, lease.kind, lease.attempts, lease.queue)
        started = time.monotonic()
        ending = self._run_body(ctx, kind)
        elapsed = time.monotonic() - started
        report = Report(
            compute_seconds=max(elapsed - ctx.waits["db"] - ctx.waits["storage"], 0.0),
            db_wait_seconds=ctx.waits["db"],
            storage_wait_seconds=ctx.waits["storage"],
            usage=ctx.usage or None,
            spans=ctx.spans.finished(),
        )
        if isinstance(ending, outcomes.Raised) and ending.classification is outcomes.Classification.CONNECTION_LOST:
            connection.close()  # the session is broken: the report (or the next job) opens a new one
        decision = outcomes.decide(ending, lease, kind, rejected=ctx.rejection)
        if self._batching and isinstance(decision, outcomes.Complete) and lease.delivery == Delivery.AT_LEAST_ONCE:
            # Written with the rest of the batch's completions, in one statement (_flush). Only an
            # at_least_once job's: if this process dies first, the lease expires and the reaper
            # requeues it (the body runs again; its effects are the ledger's). An at_most_once
            # completion is written now.
            with self._held_lock:
                if not self._done:
                    self._done_since = time.monotonic()
                self._done.append(_Done(transitions.Ending(decision, lease, report, ctx.redactor), elapsed))
            return
        self._report(lease, decision, report, elapsed=elapsed)

    def _run_body(self, ctx: JobContext, kind: kinds.JobKind) -> outcomes.Ending:
        """Call the body under the alarms and its ceilings (workers.bounds) and say how it ended.
        Nothing here writes."""
        ceilings = get_bounds()
        limits = bounds.limits_for(kind)
        armed: bounds.Limits | None = None
        try:
            with self._alarm_lock:
                self.current = ctx
                self._in_body = True
            self._rearm()
            ceilings.arm(limits, attempt_id=ctx.lease.attempt_id, lease_token=ctx.lease.lease_token)
            try:
                value = kind.body(ctx, dict(ctx.lease.input))
            finally:
                armed = ceilings.disarm()
                with self._alarm_lock:
                    self._in_body = False
                    if self._alarm_enabled:
                        signal.setitimer(signal.ITIMER_REAL, 0)
            return outcomes.Returned(value=value, state_delta=ctx.state_delta)
        except bounds.CpuLimitExceeded:
            ceilings.disarm()
            return outcomes.OverLimit(limit=bounds.Limit.CPU, limits=limits)
        except MemoryError as exc:
            armed = armed or ceilings.disarm()
            if armed is not None and armed.memory_mb:
                return outcomes.OverLimit(limit=bounds.Limit.MEMORY, limits=limits)
            return outcomes.Raised.of(exc)
        except Interrupted as exc:
            return outcomes.Interrupted(why=outcomes.Cut.named(exc.why))
        except Paused:
            return outcomes.GivenBack(why="released by a stop pause")
        except ReconcileLater as exc:
            return outcomes.Reconciling(detail=exc.detail, delay_seconds=exc.delay_seconds)
        except Park as exc:
            return outcomes.Parked(reason=exc.reason, detail=exc.detail, parked_on=exc.parked_on)
        except StaleAttempt as exc:
            return outcomes.Stale(rejection=exc.rejection)
        except Exception as exc:
            return outcomes.Raised.of(exc)
        finally:
            self.current = None

    def _report(
        self, lease: Lease, decision: outcomes.Decision, report: Report | None = None, *, elapsed: float = 0.0
    ) -> Rejection | None:
        """Record an attempt's end through the one transition writer, retried through a dropped
        connection, each rejection handled by name; then its one outcome line (``_log_outcome``)."""
        if transitions.outcome_of(decision) is None:  # Discard: nothing this attempt says counts
            transitions.log_outcome(lease, decision, report, elapsed=elapsed)
            return None
        answers = self._write([transitions.Ending(decision, lease, report)])
        if answers is None:
            transitions.log_outcome(lease, decision, report, elapsed=elapsed, unrecorded=True)
            return None
        return self._reported(lease, decision, answers[0], report=report, elapsed=elapsed)

    def _write(self, endings: list[transitions.Ending]) -> list[Rejection | None] | None:
        """The one transition writer, retried through a dropped connection (None: gave up)."""
        what = ", ".join(f"{e.lease.job_id}" for e in endings)
        for retry in range(4):
            try:
                if len(endings) == 1:
                    e = endings[0]
                    return [transitions.end_attempt(e.decision, e.lease, e.report)]
                return transitions.end_attempts(endings)
            except (OperationalError, InterfaceError) as exc:
                # The commit may or may not have happened; the repeat answers already_recorded if it did.
                log.warning("jobs %s: reporting their ends failed (%s); retrying", what, type(exc).__name__)
                connection.close()
                time.sleep(0.2 * 2**retry)
        log.error("jobs %s: could not report their ends; the leases will expire and the reaper decides", what)
        return None

    def _flush(self) -> None:
        """Write the batch's completions held in memory: one statement for all (end_attempts)."""
        with self._held_lock:
            done, self._done = self._done, []
        if not done:
            return
        answers = self._write([d.ending for d in done])
        for i, d in enumerate(done):
            e = d.ending
            with redaction.bind(e.redactor or redaction.EMPTY):
                if answers is None:
                    transitions.log_outcome(e.lease, e.decision, e.report, elapsed=d.elapsed, unrecorded=True)
                else:
                    self._reported(e.lease, e.decision, answers[i], report=e.report, elapsed=d.elapsed)

    def _reported(
        self, lease: Lease, decision: outcomes.Decision, rejection: Rejection | None, *, report: Report | None, elapsed: float
    ) -> Rejection | None:
        """The one line a person (or a log collector) reads for an attempt's recorded, or refused, end."""
        if rejection is Rejection.ALREADY_RECORDED:  # our earlier report landed (its reply was lost): success
            transitions.log_outcome(lease, decision, report, elapsed=elapsed)
            return Rejection.ALREADY_RECORDED
        transitions.log_outcome(lease, decision, report, elapsed=elapsed, rejection=rejection)
        return rejection

    @property
    def _batching(self) -> bool:
        return bool(self._waiting) or self._in_batch

    _in_batch = False

    def _run_batch(self, got: list[Lease]) -> int:
        """Run claimed leases in turn; the ones not started yet wait in ``_waiting`` (held alive by
        the heartbeat thread). Returns how many ran."""
        ran = 0
        with self._held_lock:
            self._waiting = list(got[1:])
            self._held_beat_at = time.monotonic()
        self._in_batch = len(got) > 1
        try:
            for i, lease in enumerate(got):
                if i > 0:
                    if self.shutdown_requested.is_set() or get_bounds().spent:
                        # The rest are given back unstarted (_give_back_waiting). After a CPU-limited
                        # attempt this work horse cannot grant another its allowance (workers.bounds):
                        # the doorbell rings for them (_drain).
                        break
                    with self._held_lock:
                        self._waiting.remove(lease)
                        lost = lease.job_id in self._lost
                    if lost:
                        # Its lease was taken while it waited (the reaper, an operator): its body
                        # never started, and now it never will here.
                        log.warning("job %s: lease lost while waiting in the batch; not started", lease.job_id)
                        continue
                last = self._last_in_horse(lease)
                if last:
                    # A CPU-limited attempt is the last this work horse runs (workers.bounds): give
                    # back the batch's waiting jobs and write its completions first, so a horse the
                    # hard limit kills leaves neither to the reaper.
                    self._give_back_waiting()
                    self._flush()
                self.run(lease)
                ran += 1
                if last:
                    break
        finally:
            self._in_batch = False
        return ran

    def _last_in_horse(self, lease: Lease) -> bool:
        kind = kinds.get(lease.kind, lease.version)
        return get_bounds().enforcing and kind is not None and not kind.remote and bounds.limits_for(kind).cpu_seconds > 0

    def _give_back_waiting(self) -> None:
        """Leases of the batch that never started (shutdown, an error): back to the queue, no attempt used."""
        with self._held_lock:
            waiting, self._waiting = self._waiting, []
            waiting = [lease for lease in waiting if lease.job_id not in self._lost]
            self._lost = set()
        if waiting:
            transitions.give_back(waiting, why="the worker stopped before starting it")

    def drain(self, *, first_job_id: int | None, origin_queue: str) -> int:
        """Claim and run the named job, then further due jobs, within the batch bounds."""
        self.ensure_heartbeat()
        with self._alarms():
            return self._drain(first_job_id=first_job_id, origin_queue=origin_queue)

    def _drain(self, *, first_job_id: int | None, origin_queue: str) -> int:
        served = [k.key for k in kinds.runnable()]
        queues = self.queues or [origin_queue]
        batch = int(settings.KOALA_DRAIN_BATCH)
        stop_at = time.monotonic() + float(settings.KOALA_DRAIN_SECONDS)
        ran = 0
        # Read once per pass (at most KOALA_DRAIN_BATCH jobs or KOALA_DRAIN_SECONDS): whether any
        # budget gates claims (the common case then claims in one statement), the live pauses.
        state = ClaimPass.read()
        if first_job_id is not None and not self.shutdown_requested.is_set():
            lease = leases.claim_job(
                job_id=first_job_id, worker=self.name, lease_seconds=self.lease_seconds, served=served, gated=state.gated
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
        # Batch claims (docs/engine.md, "Batch claims"): claim up to `size` due jobs in one
        # statement, run them in turn, write their completions in one statement. `size` doubles
        # while claims come back full of batchable jobs, up to KOALA_CLAIM_BATCH, and falls back
        # to what the queue gave (1 on a thin queue). Only while no budget gates claims: a gated
        # claim admits each job against its concurrency limit, which a waiting job would hold.
        limit = 1 if state.gated else int(settings.KOALA_CLAIM_BATCH)
        size = 1
        try:
            while ran < batch and time.monotonic() < stop_at and not self.shutdown_requested.is_set() and not get_bounds().spent:
                want = min(size, batch - ran)
                got = leases.claim_from(
                    queues=queues,
                    served=served,
                    worker=self.name,
                    lease_seconds=self.lease_seconds,
                    count=want,
                    state=state,
                    batchable=want > 1,
                )
                if not got and want > 1:
                    # The batch claim takes only jobs that may wait (sql.CLAIM_NEXT_MANY): one of
                    # any delivery, as before, so an at_most_once job (or a last attempt) runs too.
                    got = leases.claim_from(
                        queues=queues, served=served, worker=self.name, lease_seconds=self.lease_seconds, count=1, state=state
                    )
                if not got:
                    exhausted = True
                    break
                full = len(got) == want and all(_batchable(lease) for lease in got)
                size = min(size * 2, limit) if full else max(1, min(len(got), size))
                ran += self._run_batch(got)
                self._flush()
        finally:
            self._give_back_waiting()
            self._flush()
        if not exhausted and not self.shutdown_requested.is_set():
            # We stopped at the batch bound with work possibly left: ring so it continues.
            from workers.services.maintenance import dispatch

            dispatch()
        return ran


@dataclass(frozen=True)
class _Done:
    """A completion of the batch held in memory until _flush writes it."""

    ending: transitions.Ending
    elapsed: float


def _batchable(lease: Lease) -> bool:
    """Whether ``lease`` is a job a batch claim would take (sql.CLAIM_NEXT_MANY's ``batchable``)."""
    return lease.delivery == Delivery.AT_LEAST_ONCE and lease.attempts < lease.max_attempts


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
