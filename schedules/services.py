"""Schedules' writes: create, update, pause, resume, run now, backfill, and the materialiser.

Every service is keyword-only, runs in one transaction and writes its audit row there. The
materialiser (``materialise``, the beat task's body) claims due schedules with ``FOR UPDATE SKIP
LOCKED`` one at a time, so any number of beat replicas share them and none waits for another;
for each it computes the due slots from stored state (``last_slot_at``), asks ``decide`` what
to do, and writes each run's job and its Occurrence row in one transaction.
"""

from __future__ import annotations

import hashlib
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from koala.audit import AuditAction, record_audit
from schedules import decide as decide_mod
from schedules.decide import CatchUp, Decision, Overlap, Policy
from schedules.errors import ScheduleError
from schedules.models import Occurrence, OccurrenceState, Schedule
from schedules.timing import Timing, TimingError, check
from workers import kinds, targets
from workers.errors import EnqueueError
from workers.models import TERMINAL_STATES, Job, JobState
from workers.services import jobs
from workers.services.jobs import JobSpec

log = logging.getLogger("koala.schedules")

# Schedules one beat tick materialises at most (per replica); the rest wait for the next tick.
MAX_SCHEDULES_PER_TICK = 200
# A backfill runs at most this many slots; a wider range is refused (narrow it, or run it in parts).
MAX_BACKFILL_SLOTS = 100
# Due slots walked at most per decision: a gap longer than this (a year of minutes) is skipped in one step.
MAX_WALK = 1_000_000
SYSTEM_ACTOR = "schedule"

FIELDS = (
    "kind",
    "input",
    "queue",
    "cron",
    "interval_seconds",
    "zone",
    "starts_at",
    "ends_at",
    "jitter_seconds",
    "catch_up",
    "catch_up_window_seconds",
    "catch_up_max",
    "overlap",
    "pause_on_failures",
)
_TIMING_FIELDS = {"cron", "interval_seconds", "zone", "starts_at", "ends_at"}


# -- pure helpers on a stored row --------------------------------------------------------------
def timing_of(schedule: Schedule) -> Timing:
    return Timing(
        zone=schedule.zone,
        cron=schedule.cron,
        interval_seconds=schedule.interval_seconds,
        anchor=schedule.anchor_at,
        starts_at=schedule.starts_at,
        ends_at=schedule.ends_at,
    )


def policy_of(schedule: Schedule) -> Policy:
    return Policy(
        catch_up=CatchUp(schedule.catch_up),
        overlap=Overlap(schedule.overlap),
        window_seconds=schedule.catch_up_window_seconds,
        max_count=schedule.catch_up_max,
    )


def jitter_for(*, schedule_id: int, slot: datetime, jitter_seconds: int) -> int:
    """The slot's delay in whole seconds, 0..jitter_seconds: a fixed function of (schedule, slot),
    so every replica, the preview and a rerun agree."""
    if jitter_seconds <= 0:
        return 0
    digest = hashlib.sha256(f"{schedule_id}:{slot.astimezone(UTC).isoformat()}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (jitter_seconds + 1)


def idempotency_key(*, schedule_id: int, slot: datetime, manual: bool = False) -> str:
    stamp = slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"schedule:{schedule_id}:{'manual:' if manual else ''}{stamp}"


@dataclass(frozen=True)
class Due:
    slots: list[datetime]
    truncated: bool
    newest: datetime | None  # the newest due slot, with or without a row: the last slot decided moves past it


def due_slots(schedule: Schedule, *, now: datetime, exclude: Iterable[datetime] = ()) -> Due:
    """The slots strictly after the last one decided and at or before ``now`` (the newest
    ``decide.MAX_SLOTS`` of them), without those that already have a row (a backfill's)."""
    timing = timing_of(schedule)
    start = schedule.last_slot_at or schedule.anchor_at - timedelta(microseconds=1)
    newest: deque[datetime] = deque(maxlen=decide_mod.MAX_SLOTS)
    walked = 0
    for slot in timing.after(start):
        if slot > now or walked >= MAX_WALK:
            break
        newest.append(slot)
        walked += 1
    taken = set(exclude)
    return Due(
        slots=[slot for slot in newest if slot not in taken],
        truncated=walked > decide_mod.MAX_SLOTS,
        newest=newest[-1] if newest else None,
    )


def _recent_jobs(schedule: Schedule, count: int) -> list[tuple[Occurrence, str | None]]:
    """The newest runs of the schedule (by row id) with their job's state (None: pruned)."""
    runs = list(Occurrence.objects.filter(schedule=schedule, job_id__isnull=False).order_by("-id")[:count])
    states = dict(Job.objects.filter(pk__in=[run.job_id for run in runs]).values_list("pk", "state"))
    return [(run, states.get(run.job_id) if run.job_id is not None else None) for run in runs]


def _active(schedule: Schedule) -> bool:
    # overlap skip keeps one run live, buffer_one two (the buffered one enqueued): the newest few
    # runs hold every live one (manual and backfill runs count too).
    return any(state is not None and state not in TERMINAL_STATES for _, state in _recent_jobs(schedule, 5))


def plan(schedule: Schedule, *, now: datetime) -> tuple[Decision, bool, bool]:
    """What the materialiser would do for ``schedule`` at ``now``: (decision, active, buffered). Reads only."""
    lower = schedule.last_slot_at or schedule.anchor_at - timedelta(microseconds=1)
    taken = Occurrence.objects.filter(schedule=schedule, slot_at__gt=lower, slot_at__lte=now).exclude(
        state=OccurrenceState.MANUAL
    )
    due = due_slots(schedule, now=now, exclude=taken.values_list("slot_at", flat=True))
    active = _active(schedule)
    buffered = Occurrence.objects.filter(schedule=schedule, state=OccurrenceState.BUFFERED).exists()
    decision = decide_mod.decide(
        due=due.slots,
        now=now,
        policy=policy_of(schedule),
        active=active,
        buffered=buffered,
        # A due slot a backfill already ran is decided too: the last slot moves past it.
        last_slot=max(filter(None, [schedule.last_slot_at, due.newest]), default=None),
        truncated=due.truncated,
    )
    return decision, active, buffered


# -- the materialiser --------------------------------------------------------------------------
@dataclass
class TickReport:
    schedules: int = 0
    enqueued: int = 0
    skipped: int = 0
    buffered: int = 0
    paused: int = 0

    def loggable(self) -> dict[str, int]:
        return {"enqueued": self.enqueued, "skipped": self.skipped, "buffered": self.buffered, "paused": self.paused}


def beat_tick() -> dict[str, int]:
    return materialise(now=timezone.now()).loggable()


def materialise(*, now: datetime, limit: int = MAX_SCHEDULES_PER_TICK) -> TickReport:
    """Materialise every due schedule's slots at ``now``, one schedule per transaction."""
    report = TickReport()
    for _ in range(limit):
        with transaction.atomic():
            buffered = Occurrence.objects.filter(schedule=OuterRef("pk"), state=OccurrenceState.BUFFERED)
            schedule = (
                Schedule.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(paused_at__isnull=True)
                .filter(Q(next_slot_at__lte=now) | Exists(buffered))
                .order_by("next_slot_at", "pk")
                .first()
            )
            if schedule is None:
                break
            _materialise_one(schedule, now=now, report=report)
            report.schedules += 1
    return report


def _spec(schedule: Schedule, *, slot: datetime, now: datetime, manual: bool = False) -> JobSpec:
    delay = 0.0
    if not manual:
        fire = slot + timedelta(seconds=jitter_for(schedule_id=schedule.pk, slot=slot, jitter_seconds=schedule.jitter_seconds))
        delay = max(0.0, (fire - now).total_seconds())
    return JobSpec(
        kind=schedule.kind,
        input=schedule.input,
        idempotency_key=idempotency_key(schedule_id=schedule.pk, slot=slot, manual=manual),
        queue=schedule.queue or None,
        delay_seconds=delay,
        correlation_id=f"schedule:{schedule.pk}",
    )


def _fire_at(schedule: Schedule, slot: datetime) -> datetime:
    return slot + timedelta(seconds=jitter_for(schedule_id=schedule.pk, slot=slot, jitter_seconds=schedule.jitter_seconds))


def _failed_in_a_row(schedule: Schedule) -> list[int] | None:
    """The job ids of the last ``pause_on_failures`` runs when every one of them failed, else None."""
    count = schedule.pause_on_failures
    if not count:
        return None
    runs = _recent_jobs(schedule, count)
    if schedule.failures_since is not None:
        runs = [(run, state) for run, state in runs if run.created_at >= schedule.failures_since]
    if len(runs) < count or any(state != JobState.FAILED for _, state in runs):
        return None
    return [run.job_id for run, _ in runs if run.job_id is not None]


def _materialise_one(schedule: Schedule, *, now: datetime, report: TickReport) -> None:
    failed = _failed_in_a_row(schedule)
    if failed is not None:
        reason = f"{len(failed)} failed runs in a row (jobs {', '.join(f'#{j}' for j in failed)})"
        _set_paused(schedule, actor=SYSTEM_ACTOR, reason=reason, now=now)
        report.paused += 1
        log.warning("schedule %s paused: %s", schedule.name, reason)
        return
    decision, _, _ = plan(schedule, now=now)
    skipped: list[tuple[datetime, str]] = [(slot, str(reason)) for slot, reason in decision.skipped]
    if decision.truncated and skipped:
        first, why = skipped[0]
        skipped[0] = (
            first,
            f"{why}; older missed slots before it were not recorded one by one (more than {decide_mod.MAX_SLOTS})",
        )
    runs = list(decision.enqueue)
    if decision.promote_buffered:
        held = Occurrence.objects.select_for_update().get(schedule=schedule, state=OccurrenceState.BUFFERED)
        job_ids = _enqueue(schedule, [held.slot_at], now=now, skipped=skipped)
        if job_ids:
            held.state, held.job_id = OccurrenceState.ENQUEUED, job_ids[0]
            held.save(update_fields=["state", "job_id"])
            report.enqueued += 1
        else:
            held.delete()
    job_ids = _enqueue(schedule, runs, now=now, skipped=skipped)
    rows = [
        Occurrence(
            schedule=schedule, slot_at=slot, fire_at=_fire_at(schedule, slot), state=OccurrenceState.ENQUEUED, job_id=job_id
        )
        for slot, job_id in zip(runs if job_ids else [], job_ids, strict=True)
    ]
    if decision.buffer is not None:
        rows.append(
            Occurrence(
                schedule=schedule,
                slot_at=decision.buffer,
                fire_at=_fire_at(schedule, decision.buffer),
                state=OccurrenceState.BUFFERED,
            )
        )
    rows += [
        Occurrence(schedule=schedule, slot_at=slot, fire_at=slot, state=OccurrenceState.SKIPPED, reason=why)
        for slot, why in skipped
    ]
    Occurrence.objects.bulk_create(rows)
    report.enqueued += len(job_ids)
    report.buffered += decision.buffer is not None
    report.skipped += len(skipped)
    if decision.last_slot is not None:
        schedule.last_slot_at = decision.last_slot
    schedule.next_slot_at = timing_of(schedule).next_after(
        schedule.last_slot_at or schedule.anchor_at - timedelta(microseconds=1)
    )
    schedule.save(update_fields=["last_slot_at", "next_slot_at", "updated_at"])


def _enqueue(schedule: Schedule, slots: list[datetime], *, now: datetime, skipped: list[tuple[datetime, str]]) -> list[int]:
    """The slots' jobs, created in the caller's transaction; a refused enqueue (a kind this
    deployment no longer serves, a queue gone) records the slots skipped with its reason instead."""
    if not slots:
        return []
    try:
        with transaction.atomic():
            results = jobs.enqueue_many(specs=[_spec(schedule, slot=slot, now=now) for slot in slots])
    except EnqueueError as exc:
        skipped += [(slot, f"refused: {exc}"[:500]) for slot in slots]
        skipped.sort()
        return []
    return [result.job_id for result in results]


# -- people's writes ---------------------------------------------------------------------------
def validated(values: Mapping[str, Any]) -> dict[str, Any]:
    """The schedule's fields checked as one spec, or ScheduleError saying what is wrong."""
    data = dict(values)
    data.setdefault("input", {})
    data.setdefault("queue", "")
    data.setdefault("cron", "")
    data["cron"] = (data.get("cron") or "").strip()
    try:
        check(
            Timing(
                zone=data.get("zone") or "",
                cron=data["cron"],
                interval_seconds=data.get("interval_seconds"),
                starts_at=data.get("starts_at"),
                ends_at=data.get("ends_at"),
            )
        )
    except TimingError as exc:
        raise ScheduleError(str(exc)) from None
    for name in ("starts_at", "ends_at"):
        if data.get(name) is not None and timezone.is_naive(data[name]):
            raise ScheduleError(f"{name} needs an offset (e.g. 2027-01-01T00:00:00+01:00).")
    try:
        kind = kinds.latest(data.get("kind") or "")
        if data["queue"]:
            targets.check_queue(data["queue"])
        if not isinstance(data["input"], dict):
            raise ScheduleError("input must be a JSON object.")
        kind.check_input(data["input"])
    except EnqueueError as exc:
        raise ScheduleError(str(exc)) from None
    try:
        data["catch_up"] = CatchUp(data.get("catch_up") or CatchUp.SKIP)
        data["overlap"] = Overlap(data.get("overlap") or Overlap.SKIP)
    except ValueError as exc:
        raise ScheduleError(f"{exc}: catch_up is skip, latest or all_within; overlap is skip, buffer_one or allow.") from None
    if data["catch_up"] is CatchUp.ALL_WITHIN:
        if not data.get("catch_up_window_seconds") or not data.get("catch_up_max"):
            raise ScheduleError("catch_up all_within needs catch_up_window_seconds and catch_up_max, both above 0.")
    else:
        data["catch_up_window_seconds"] = data["catch_up_max"] = None
    for name in ("jitter_seconds", "catch_up_window_seconds", "catch_up_max", "pause_on_failures"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ScheduleError(f"{name} must be a whole number of 0 or more, not {value!r}.")
    if data.get("pause_on_failures") == 0:
        data["pause_on_failures"] = None
    data.setdefault("jitter_seconds", 0)
    if data["jitter_seconds"] is None:
        data["jitter_seconds"] = 0
    unknown = set(data) - set(FIELDS)
    if unknown:
        raise ScheduleError(f"unknown schedule fields: {', '.join(sorted(unknown))}.")
    return data


def create_schedule(*, name: str, actor: str, now: datetime | None = None, **values: Any) -> Schedule:
    """A new schedule, its first slot strictly after ``now`` (its start, if later)."""
    now = now or timezone.now()
    data = validated(values)
    with transaction.atomic():
        schedule = Schedule(name=name, created_by=actor, anchor_at=data.get("starts_at") or now, **data)
        if schedule.starts_at is None or schedule.starts_at <= now:
            # Slots before now were never wanted: the schedule's history starts at its creation.
            schedule.last_slot_at = now
            schedule.next_slot_at = timing_of(schedule).next_after(now)
        else:  # its first slot may be its start itself
            schedule.next_slot_at = timing_of(schedule).next_after(schedule.starts_at - timedelta(microseconds=1))
        try:
            # The name (a slug, unique) and the columns' bounds; the rules were checked above.
            schedule.full_clean(exclude=["input", "anchor_at", "last_slot_at", "next_slot_at"])
            schedule.save()
        except ValidationError as exc:
            raise ScheduleError(" ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())) from None
        except IntegrityError:  # a concurrent create of the same name won
            raise ScheduleError(f"a schedule named {name!r} already exists.") from None
        record_audit(
            actor=actor,
            action=AuditAction.SCHEDULE_CREATE,
            target_type="schedule",
            target_id=schedule.pk,
            details={"name": name, **_describe(schedule)},
        )
    return schedule


def update_schedule(*, schedule_id: int, actor: str, now: datetime | None = None, **changes: Any) -> Schedule:
    """Change a schedule; the beat replicas read it on their next tick (no restart). A change of
    when slots fall starts from now: slots already decided stay, no slot before now is re-run."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked(schedule_id)
        current = {name: getattr(schedule, name) for name in FIELDS}
        data = validated({**current, **changes})
        changed = {name for name in FIELDS if data.get(name) != current[name]}
        for name in changed:
            setattr(schedule, name, data[name])
        if changed & _TIMING_FIELDS:
            schedule.anchor_at = schedule.starts_at or now
            if schedule.last_slot_at is None or schedule.last_slot_at < now:
                schedule.last_slot_at = now
            schedule.next_slot_at = timing_of(schedule).next_after(schedule.last_slot_at)
        try:
            schedule.full_clean(exclude=["name", "input", "anchor_at", "last_slot_at", "next_slot_at"])
        except ValidationError as exc:
            raise ScheduleError(" ".join(f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items())) from None
        schedule.save()
        record_audit(
            actor=actor,
            action=AuditAction.SCHEDULE_UPDATE,
            target_type="schedule",
            target_id=schedule.pk,
            details={"changed": sorted(changed), **{name: _plain(data[name]) for name in sorted(changed)}},
        )
    return schedule


def pause_schedule(*, schedule_id: int, actor: str, reason: str, now: datetime | None = None) -> Schedule:
    """No new slot is decided from this commit on (the materialiser never picks a paused schedule)."""
    if not reason.strip():
        raise ScheduleError("say why the schedule is paused (a reason).")
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if schedule.paused:
            raise ScheduleError(
                f"schedule {schedule.name} is already paused (by {schedule.paused_by}: {schedule.paused_reason})."
            )
        _set_paused(schedule, actor=actor, reason=reason, now=now or timezone.now())
    return schedule


def _set_paused(schedule: Schedule, *, actor: str, reason: str, now: datetime) -> None:
    schedule.paused_at, schedule.paused_by, schedule.paused_reason = now, actor, reason[:500]
    schedule.save(update_fields=["paused_at", "paused_by", "paused_reason", "updated_at"])
    record_audit(
        actor=actor,
        action=AuditAction.SCHEDULE_PAUSE,
        target_type="schedule",
        target_id=schedule.pk,
        details={"reason": reason[:500]},
    )


def resume_schedule(*, schedule_id: int, actor: str, now: datetime | None = None) -> Schedule:
    """Lift the pause: the next tick applies the catch-up policy to the slots missed meanwhile
    (``selectors.preview_catch_up`` shows which, before)."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked(schedule_id)
        if not schedule.paused:
            raise ScheduleError(f"schedule {schedule.name} is not paused.")
        details = {"paused_by": schedule.paused_by, "paused_reason": schedule.paused_reason}
        schedule.paused_at, schedule.paused_by, schedule.paused_reason = None, "", ""
        schedule.failures_since = now
        schedule.save(update_fields=["paused_at", "paused_by", "paused_reason", "failures_since", "updated_at"])
        record_audit(
            actor=actor, action=AuditAction.SCHEDULE_RESUME, target_type="schedule", target_id=schedule.pk, details=details
        )
    return schedule


def run_now(*, schedule_id: int, actor: str, now: datetime | None = None) -> Occurrence:
    """A manual slot at ``now``: one job, outside the rule's slots and its overlap policy (a
    person asked for it), audited."""
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _locked(schedule_id)
        try:
            result = jobs.enqueue_many(specs=[_spec(schedule, slot=now, now=now, manual=True)], created_by=actor)[0]
        except EnqueueError as exc:
            raise ScheduleError(str(exc)) from None
        occurrence = Occurrence.objects.create(
            schedule=schedule, slot_at=now, fire_at=now, state=OccurrenceState.MANUAL, job_id=result.job_id, created_by=actor
        )
        record_audit(
            actor=actor,
            action=AuditAction.SCHEDULE_RUN_NOW,
            target_type="schedule",
            target_id=schedule.pk,
            details={"job_id": result.job_id},
        )
    return occurrence


@dataclass(frozen=True)
class BackfillPlan:
    schedule_id: int
    start: datetime
    end: datetime
    run: list[datetime] = field(default_factory=list)  # slots that get a job (never run before)
    already: list[tuple[datetime, str]] = field(default_factory=list)  # (slot, state) run or waiting already
    job_ids: list[int] = field(default_factory=list)  # filled when not a dry run


def backfill(
    *, schedule_id: int, actor: str, start: datetime, end: datetime, dry_run: bool, now: datetime | None = None
) -> BackfillPlan:
    """Run the rule's slots in [start, end] (a past range) that never ran: at most
    MAX_BACKFILL_SLOTS, else refused. A skipped slot's row becomes its backfill run. ``dry_run``
    returns the same plan and writes nothing."""
    now = now or timezone.now()
    if timezone.is_naive(start) or timezone.is_naive(end):
        raise ScheduleError("a backfill range needs offsets (e.g. 2026-03-01T00:00:00+01:00).")
    if end < start:
        raise ScheduleError("the backfill range ends before it starts.")
    if end > now:
        raise ScheduleError("a backfill covers past slots only: its end must not be later than now.")
    with transaction.atomic():
        schedule = _locked(schedule_id) if not dry_run else _get(schedule_id)
        slots: list[datetime] = []
        for slot in timing_of(schedule).after(start - timedelta(microseconds=1)):
            if slot > end:
                break
            slots.append(slot)
            if len(slots) > MAX_BACKFILL_SLOTS:
                raise ScheduleError(f"the range holds more than {MAX_BACKFILL_SLOTS} slots; backfill a narrower range.")
        existing = {
            row.slot_at: row
            for row in Occurrence.objects.filter(schedule=schedule, slot_at__in=slots).exclude(state=OccurrenceState.MANUAL)
        }
        run = [slot for slot in slots if slot not in existing or existing[slot].state == OccurrenceState.SKIPPED]
        already = [(slot, existing[slot].state) for slot in slots if slot not in run]
        plan_ = BackfillPlan(schedule_id=schedule.pk, start=start, end=end, run=run, already=already)
        if dry_run or not run:
            return plan_
        try:
            results = jobs.enqueue_many(
                specs=[_spec(schedule, slot=slot, now=now, manual=False) for slot in run], created_by=actor
            )
        except EnqueueError as exc:
            raise ScheduleError(str(exc)) from None
        for slot, result in zip(run, results, strict=True):
            if slot in existing:
                row = existing[slot]
                row.state, row.job_id, row.created_by = OccurrenceState.BACKFILL, result.job_id, actor
                row.reason = f"was skipped: {row.reason}"[:500]
                row.save(update_fields=["state", "job_id", "created_by", "reason"])
            else:
                Occurrence.objects.create(
                    schedule=schedule,
                    slot_at=slot,
                    fire_at=slot,
                    state=OccurrenceState.BACKFILL,
                    job_id=result.job_id,
                    created_by=actor,
                )
        record_audit(
            actor=actor,
            action=AuditAction.SCHEDULE_BACKFILL,
            target_type="schedule",
            target_id=schedule.pk,
            details={
                "start": start.isoformat(),
                "end": end.isoformat(),
                "slots": len(run),
                "job_ids": [r.job_id for r in results],
            },
        )
        return BackfillPlan(
            schedule_id=schedule.pk, start=start, end=end, run=run, already=already, job_ids=[r.job_id for r in results]
        )


def _get(schedule_id: int) -> Schedule:
    try:
        return Schedule.objects.get(pk=schedule_id)
    except Schedule.DoesNotExist:
        raise ScheduleError(f"no schedule #{schedule_id}.") from None


def _locked(schedule_id: int) -> Schedule:
    try:
        return Schedule.objects.select_for_update().get(pk=schedule_id)
    except Schedule.DoesNotExist:
        raise ScheduleError(f"no schedule #{schedule_id}.") from None


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else str(value) if isinstance(value, CatchUp | Overlap) else value


def _describe(schedule: Schedule) -> dict[str, Any]:
    return {name: _plain(getattr(schedule, name)) for name in FIELDS if name != "input"}
