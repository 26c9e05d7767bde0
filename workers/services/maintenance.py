"""The beat's work: reap expired leases, fail jobs past their deadline, re-ring the doorbell.

Every step is a conditional UPDATE, so any number of koala_beat replicas can run at
once: a row changes once, whichever replica gets there first.

``beat_tick`` runs one tick as isolated steps (the engine's, then each app's beat task, then
dispatch, then retention when due): a step that raises is logged, counted in its ``BeatTask``
row and tried again next tick, and never keeps the steps after it from running. Retention is the
one step the replicas share rather than repeat (``sql.BEAT_CLAIM``: one pass per interval in
all); every other step is safe on every replica (conditional UPDATEs, SKIP LOCKED batches,
a doorbell whose duplicate messages are no-ops).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from workers import doorbell, hooks, sql, transitions
from workers.transitions import ReapReport

log = logging.getLogger("koala.beat")


def reap(*, grace_seconds: float | None = None) -> ReapReport:
    """Expired lease → attempt orphaned. After the grace period: at_least_once requeues
    (if attempts remain), at_most_once fails with reason ``orphaned`` (workers.transitions.reap)."""
    grace = settings.KOALA_ORPHAN_GRACE_SECONDS if grace_seconds is None else grace_seconds
    return transitions.reap(grace_seconds=grace)


def dispatch(*, depth: int | None = None) -> int:
    """Ring the doorbell for every queue with due jobs, from database state alone.

    This is what makes Redis disposable: after a restart or FLUSHALL the queues are
    empty, and the next tick pushes messages for the oldest due jobs again. Pushing
    when a message already exists is harmless (a duplicate delivery is a no-op).
    """
    limit = settings.KOALA_DOORBELL_DEPTH if depth is None else depth
    with connection.cursor() as cursor:
        cursor.execute(sql.DISPATCH_DUE, [limit])
        rows = cursor.fetchall()
    by_queue: dict[str, list[tuple[int, int]]] = {}
    for queue, job_id, version in rows:
        by_queue.setdefault(queue, []).append((job_id, version))
    # Aim for one pending message per due job (up to the depth): fewer would leave
    # workers idle, more would only wake them for nothing.
    return sum(doorbell.ring(queue, jobs, depth=len(jobs)) for queue, jobs in by_queue.items())


@dataclass(frozen=True)
class SafetyReport:
    pauses_lifted: int
    unparked: int
    breakers_tripped: list[str]
    # What each app's beat task (workers.hooks.register_beat_task) returned, by task name:
    # e.g. {"reviews": {"expired": 1}, "exports": {"settled": 0, "temp_objects_removed": 2}}.
    tasks: dict[str, Any] = field(default_factory=dict)


def safety_tick() -> SafetyReport:
    """The safety layer's periodic work: expired pauses lift, budget-parked jobs resume when
    their budget has room, and the circuit breaker trips; then each app's beat task runs
    (undecided reviews end their job, exports settle), in the order the apps registered them.

    All at once, for a caller that wants the whole report (tests, a shell): a task that raises
    ends it. The beat itself runs these as isolated steps (``beat_tick``)."""
    lifted = lift_expired_pauses()
    unparked = unpark_budgets()
    tripped = trip_breakers()
    return SafetyReport(
        pauses_lifted=lifted,
        unparked=unparked,
        breakers_tripped=tripped,
        tasks={task.name: task.run() for task in hooks.beat_tasks()},
    )


def lift_expired_pauses() -> int:
    """Expired pauses lift; their jobs are rung at once rather than at the next tick."""
    from workers.services import pauses

    lifted = pauses.lift_expired()
    if lifted:
        transaction.on_commit(dispatch)
    return lifted


def trip_breakers() -> list[str]:
    from workers.services import pauses

    return [p.target for p in pauses.trip_breakers()]


def unpark_budgets() -> int:
    from workers.services import budgets

    return budgets.unpark_ready()


@dataclass
class StepOutcome:
    name: str
    started_at: datetime
    finished_at: datetime
    result: Any = None
    error: str = ""  # the error class ("" when it succeeded)
    message: str = ""


@dataclass
class TickReport:
    """What one tick did, step by step (``steps``: name → outcome, in the order they ran)."""

    steps: dict[str, StepOutcome] = field(default_factory=dict)
    recorded: bool = False  # the BeatTask rows were written (False: the record itself failed)

    def result(self, name: str) -> Any:
        step = self.steps.get(name)
        return step.result if step is not None and not step.error else None

    @property
    def failed(self) -> list[str]:
        return [name for name, step in self.steps.items() if step.error]


def beat_identity() -> str:
    """Which beat process wrote a BeatTask row: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _run_step(report: TickReport, name: str, run: Callable[[], Any]) -> None:
    started = timezone.now()
    try:
        result = run()
    except Exception as exc:  # isolated: logged, counted, retried next tick
        report.steps[name] = StepOutcome(name, started, timezone.now(), error=type(exc).__name__[:200], message=str(exc))
        log.warning("beat: %s failed: %s: %s", name, type(exc).__name__, exc)
        _recover_connection()
    else:
        report.steps[name] = StepOutcome(name, started, timezone.now(), result=result)


def _recover_connection() -> None:
    """After a failed step: a broken or aborted session must not fail the steps after it. Outside
    a transaction the next statement reconnects; inside one (a test's) there is nothing to do."""
    if not connection.in_atomic_block:
        connection.close()


def claim_shared(*, name: str, every_seconds: float, beat: str) -> bool:
    """Whether this replica runs a shared step now (no replica started it within every_seconds)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.BEAT_CLAIM, {"name": name, "beat": beat, "now": timezone.now(), "every": every_seconds})
        return cursor.rowcount == 1


def record_tick(report: TickReport, *, beat: str, gap_seconds: float) -> None:
    """Every step's outcome in its BeatTask row: one statement for the whole tick (sql.BEAT_RECORD)."""
    steps = list(report.steps.values())
    if not steps:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            sql.BEAT_RECORD,
            {
                "beat": beat,
                "names": [s.name for s in steps],
                "started": [s.started_at for s in steps],
                "finished": [s.finished_at for s in steps],
                "errors": [s.error for s in steps],
                "gap": gap_seconds,
            },
        )
    report.recorded = True


def beat_tick(*, prune_due: bool, interval_seconds: float, beat: str | None = None) -> TickReport:
    """One tick of the beat, each step isolated (module docstring). ``prune_due``: this replica's
    retention interval has passed, so it tries to claim the shared pass."""
    from workers.services import retention

    beat = beat or beat_identity()
    report = TickReport()
    _run_step(report, "reap", reap)
    # The safety layer: expired pauses lift, budget-parked jobs resume, the circuit breaker trips.
    _run_step(report, "pauses", lift_expired_pauses)
    _run_step(report, "budgets", unpark_budgets)
    _run_step(report, "breakers", trip_breakers)
    # Each installed app's beat task (workers.hooks), in the order the apps registered them.
    for task in hooks.beat_tasks():
        _run_step(report, task.name, task.run)
    # Always, whatever failed before: re-ringing due jobs is what keeps work moving.
    _run_step(report, "dispatch", dispatch)
    # Last, so a long backlog of old jobs never delays reaping or dispatch; bounded
    # (KOALA_RETENTION_BATCHES batches), the rest waits for the next pass.
    if prune_due:
        every = settings.KOALA_RETENTION_INTERVAL_SECONDS
        claimed = False
        try:
            claimed = claim_shared(name="retention", every_seconds=every * 0.9, beat=beat)
        except Exception as exc:
            log.warning("beat: retention claim failed: %s: %s", type(exc).__name__, exc)
            _recover_connection()
        if claimed:
            _run_step(report, "retention", retention.prune)
    try:
        record_tick(report, beat=beat, gap_seconds=interval_seconds)
    except Exception as exc:  # the record is for people; the beat goes on without it
        log.warning("beat: recording the tick failed: %s: %s", type(exc).__name__, exc)
        _recover_connection()
    return report
