"""The scheduler's health as people read it: each beat task's last tick (``koala_beat --status``)
and each timer-started task's lease (``koala_tick --list``). Reads only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from workers import hooks
from workers.models import BeatTask, TickLease


@dataclass(frozen=True)
class BeatTaskHealth:
    name: str
    row: BeatTask | None  # None: this task has never been recorded
    known: bool  # a step of the engine or a beat task this process registers
    stale_after_seconds: float
    stale: bool  # no success within stale_after_seconds (or never)
    failing: bool  # its last run failed

    @property
    def healthy(self) -> bool:
        return not self.known or not (self.stale or self.failing)


def stale_after(name: str) -> float:
    """How long without a success before a task counts as stopped: ten ticks (at least a minute);
    retention runs once per KOALA_RETENTION_INTERVAL_SECONDS, so three of those."""
    if name == "retention":
        return 3 * settings.KOALA_RETENTION_INTERVAL_SECONDS + 60
    return max(60.0, 10 * settings.KOALA_BEAT_INTERVAL_SECONDS)


def beat_health(*, now: datetime | None = None) -> list[BeatTaskHealth]:
    """Every task the beat runs here (engine steps, then the apps'), then rows of tasks this
    process does not know (an app no longer installed): shown, never judged."""
    now = now or timezone.now()
    rows = {row.name: row for row in BeatTask.objects.all()}
    names = [*hooks.ENGINE_BEAT_STEPS, *(task.name for task in hooks.beat_tasks())]
    found = []
    for name in [*names, *sorted(set(rows) - set(names))]:
        row, limit = rows.get(name), stale_after(name)
        succeeded = row.last_succeeded_at if row else None
        found.append(
            BeatTaskHealth(
                name=name,
                row=row,
                known=name in names,
                stale_after_seconds=limit,
                stale=succeeded is None or (now - succeeded).total_seconds() > limit,
                failing=bool(row and row.consecutive_failures),
            )
        )
    return found


@dataclass(frozen=True)
class TickTaskState:
    name: str
    help: str
    lease: TickLease | None
    running: bool  # an unexpired lease: a run holds it now


def tick_states(*, now: datetime | None = None) -> list[TickTaskState]:
    now = now or timezone.now()
    leases = {lease.name: lease for lease in TickLease.objects.all()}
    return [
        TickTaskState(
            name=name,
            help=task.help,
            lease=leases.get(name),
            running=bool(name in leases and leases[name].expires_at and leases[name].expires_at > now),  # type: ignore[operator]
        )
        for name, task in hooks.tick_tasks().items()
    ]
