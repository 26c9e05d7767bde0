"""The beat's work: reap expired leases, fail jobs past their deadline, re-ring the doorbell.

Every step is a conditional UPDATE, so any number of koala_beat replicas can run at
once: a row changes once, whichever replica gets there first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from workers import doorbell, hooks, sql, transitions
from workers.transitions import ReapReport


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

    A task that raises ends the tick, as the engine's own steps do: the beat logs it and the
    next tick runs everything again (each step is idempotent)."""
    from workers.services import budgets, pauses

    lifted = pauses.lift_expired()
    if lifted:
        transaction.on_commit(dispatch)
    unparked = budgets.unpark_ready()
    tripped = [p.target for p in pauses.trip_breakers()]
    return SafetyReport(
        pauses_lifted=lifted,
        unparked=unparked,
        breakers_tripped=tripped,
        tasks={task.name: task.run() for task in hooks.beat_tasks()},
    )
