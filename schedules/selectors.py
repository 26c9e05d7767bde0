"""Schedules' reads: the list, one schedule's detail (next fires in its zone and in UTC, last
runs with their outcomes, the rule in words) and the preview of what a resume or catch-up would
fire now. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from schedules.decide import Reason
from schedules.errors import ScheduleError
from schedules.models import Occurrence, Schedule
from schedules.services import jitter_for, plan, timing_of
from schedules.timing import explain

NEXT_FIRES = 10
LAST_RUNS = 20


@dataclass(frozen=True)
class Fire:
    slot_utc: datetime
    slot_local: datetime  # in the schedule's zone
    jitter_seconds: int
    fire_utc: datetime  # the slot plus its jitter: when its job becomes due

    @property
    def fire_local(self) -> datetime:
        return self.fire_utc.astimezone(self.slot_local.tzinfo)


@dataclass(frozen=True)
class Run:
    slot_local: datetime
    state: str  # the occurrence's: enqueued, buffered, skipped, manual, backfill
    reason: str
    job_id: int | None
    outcome: str  # the job's state, "" without a job, "pruned" once retention removed it


@dataclass(frozen=True)
class Preview:
    """What the materialiser would write for the schedule at ``now`` (nothing is written)."""

    now: datetime
    paused: bool
    enqueue: list[datetime]
    buffer: datetime | None
    promote_buffered: bool
    skipped: list[tuple[datetime, Reason]]
    active: bool


@dataclass(frozen=True)
class Detail:
    schedule: Schedule
    explanation: str
    next_fires: list[Fire]
    runs: list[Run]
    preview: Preview


def list_schedules() -> list[Schedule]:
    return list(Schedule.objects.order_by("name"))


def get_schedule(*, schedule_id: int | None = None, name: str | None = None) -> Schedule:
    try:
        if name is not None:
            return Schedule.objects.get(name=name)
        if schedule_id is None:
            raise ScheduleError("name a schedule (its id or its name).")
        return Schedule.objects.get(pk=schedule_id)
    except Schedule.DoesNotExist:
        raise ScheduleError(f"no schedule {name!r}." if name is not None else f"no schedule #{schedule_id}.") from None


def explanation(schedule: Schedule) -> str:
    return explain(timing_of(schedule))


def next_fires(schedule: Schedule, *, now: datetime, count: int = NEXT_FIRES) -> list[Fire]:
    timing = timing_of(schedule)
    start = max(now, schedule.last_slot_at) if schedule.last_slot_at else now
    fires = []
    for slot in timing.upcoming(start, count):
        jitter = jitter_for(schedule_id=schedule.pk, slot=slot, jitter_seconds=schedule.jitter_seconds)
        fires.append(
            Fire(
                slot_utc=slot.astimezone(UTC),
                slot_local=slot.astimezone(timing.tz),
                jitter_seconds=jitter,
                fire_utc=(slot + timedelta(seconds=jitter)).astimezone(UTC),
            )
        )
    return fires


def last_runs(schedule: Schedule, *, count: int = LAST_RUNS) -> list[Run]:
    from workers.models import Job

    tz = timing_of(schedule).tz
    occurrences = list(Occurrence.objects.filter(schedule=schedule).order_by("-slot_at", "-id")[:count])
    states = dict(Job.objects.filter(pk__in=[o.job_id for o in occurrences if o.job_id]).values_list("pk", "state"))
    return [
        Run(
            slot_local=o.slot_at.astimezone(tz),
            state=o.state,
            reason=o.reason,
            job_id=o.job_id,
            outcome="" if o.job_id is None else states.get(o.job_id, "pruned"),
        )
        for o in occurrences
    ]


def preview_catch_up(*, schedule_id: int, now: datetime | None = None) -> Preview:
    """What a resume (or the next tick) would fire at ``now``: the catch-up and overlap policies
    applied to the slots missed since the last one decided."""
    schedule = get_schedule(schedule_id=schedule_id)
    now = now or timezone.now()
    decision, active, _ = plan(schedule, now=now)
    return Preview(
        now=now,
        paused=schedule.paused,
        enqueue=list(decision.enqueue),
        buffer=decision.buffer,
        promote_buffered=decision.promote_buffered,
        skipped=list(decision.skipped),
        active=active,
    )


def schedule_detail(*, schedule_id: int, now: datetime | None = None) -> Detail:
    schedule = get_schedule(schedule_id=schedule_id)
    now = now or timezone.now()
    return Detail(
        schedule=schedule,
        explanation=explanation(schedule),
        next_fires=next_fires(schedule, now=now),
        runs=last_runs(schedule),
        preview=preview_catch_up(schedule_id=schedule_id, now=now),
    )
