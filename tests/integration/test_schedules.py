"""Schedules against real PostgreSQL: the materialiser with a controllable clock (``now`` passed
in), the services' refusals, pause/resume, run now and backfill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from koala.models import AuditEvent
from schedules import selectors, services
from schedules.errors import ScheduleError
from schedules.models import Occurrence, Schedule
from workers.models import Job
from workers.services.jobs import cancel_job

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def make(name: str = "every-minute", *, now: datetime = T0, **values: Any) -> Schedule:
    values.setdefault("kind", "noop")
    values.setdefault("zone", "Europe/Paris")
    if "interval_seconds" not in values:
        values.setdefault("cron", "* * * * *")
    return services.create_schedule(name=name, actor="ops", now=now, **values)


def rows(schedule: Schedule) -> dict[datetime, tuple[str, str]]:
    return {o.slot_at: (o.state, o.reason) for o in Occurrence.objects.filter(schedule=schedule)}


def run_slots(schedule: Schedule) -> list[datetime]:
    return sorted(o.slot_at for o in Occurrence.objects.filter(schedule=schedule, state__in=["enqueued", "backfill"]))


def finish_runs(schedule: Schedule) -> None:
    for job_id in Occurrence.objects.filter(schedule=schedule, job_id__isnull=False).values_list("job_id", flat=True):
        assert job_id is not None
        if Job.objects.get(pk=job_id).state == "queued":
            cancel_job(job_id=job_id, actor="test")


def tick_every(schedule: Schedule, start: datetime, end: datetime, step: timedelta) -> None:
    moment = start
    while moment <= end:
        services.materialise(now=moment)
        finish_runs(schedule)
        moment += step


def test_one_job_per_slot_with_its_key_however_often_the_beat_ticks() -> None:
    schedule = make(overlap="allow")
    for moment in [T0 + timedelta(seconds=s) for s in range(0, 185, 5)] * 2:  # every tick twice
        services.materialise(now=moment)
    slots = run_slots(schedule)
    assert slots == [T0 + timedelta(minutes=m) for m in (1, 2, 3)]
    job_keys = sorted(
        str(key) for key in Job.objects.filter(correlation_id=f"schedule:{schedule.pk}").values_list("idempotency_key", flat=True)
    )
    assert job_keys == sorted(services.idempotency_key(schedule_id=schedule.pk, slot=s) for s in slots)
    schedule.refresh_from_db()
    assert schedule.last_slot_at == T0 + timedelta(minutes=3)
    assert schedule.next_slot_at == T0 + timedelta(minutes=4)


@pytest.mark.parametrize("jump", [timedelta(hours=2), -timedelta(hours=2)])
def test_a_two_hour_clock_jump_neither_loses_nor_doubles_slots(jump: timedelta) -> None:
    schedule = make(catch_up="all_within", catch_up_window_seconds=3 * 3600, catch_up_max=500, overlap="allow")
    tick_every(schedule, T0, T0 + timedelta(minutes=10), timedelta(seconds=20))
    jumped = T0 + timedelta(minutes=10) + jump
    tick_every(schedule, jumped, jumped + timedelta(minutes=10), timedelta(seconds=20))
    end = max(T0 + timedelta(minutes=10), jumped + timedelta(minutes=10))
    tick_every(schedule, end, end + timedelta(minutes=3), timedelta(seconds=20))  # the clock back to normal
    slots = run_slots(schedule)
    assert len(slots) == len(set(slots))
    assert slots == [T0 + timedelta(minutes=m) for m in range(1, len(slots) + 1)], "no slot lost"
    assert slots[-1] == (end + timedelta(minutes=3)).replace(second=0)
    assert not [r for r in rows(schedule).values() if r[0] == "skipped"]


def test_jitter_is_a_fixed_function_of_schedule_and_slot_and_the_preview_shows_it() -> None:
    schedule = make(jitter_seconds=30, overlap="allow")
    delays = {
        services.jitter_for(schedule_id=schedule.pk, slot=T0 + m * timedelta(minutes=1), jitter_seconds=30) for m in range(60)
    }
    assert delays <= set(range(31)) and len(delays) > 5
    again = [services.jitter_for(schedule_id=schedule.pk, slot=T0 + timedelta(minutes=m), jitter_seconds=30) for m in range(5)]
    assert again == [
        services.jitter_for(schedule_id=schedule.pk, slot=T0 + timedelta(minutes=m), jitter_seconds=30) for m in range(5)
    ]
    detail = selectors.schedule_detail(schedule_id=schedule.pk, now=T0)
    first = detail.next_fires[0]
    assert first.slot_utc == T0 + timedelta(minutes=1)
    assert first.fire_utc == first.slot_utc + timedelta(seconds=again[1])
    services.materialise(now=T0 + timedelta(minutes=1))
    occurrence = Occurrence.objects.get(schedule=schedule)
    assert occurrence.fire_at == first.fire_utc
    assert occurrence.job_id is not None
    job = Job.objects.get(pk=occurrence.job_id)
    assert job.scheduled_at >= job.created_at + timedelta(seconds=again[1]) - SECOND


@pytest.mark.parametrize(
    ("policy", "ran"),
    [
        ({"catch_up": "skip"}, [10]),
        ({"catch_up": "latest"}, [10]),
        ({"catch_up": "all_within", "catch_up_window_seconds": 5 * 60, "catch_up_max": 100}, [6, 7, 8, 9, 10]),
        ({"catch_up": "all_within", "catch_up_window_seconds": 3600, "catch_up_max": 3}, [8, 9, 10]),
    ],
)
def test_downtime_of_ten_slots_runs_what_the_catch_up_policy_says_and_records_the_rest(
    policy: dict[str, Any], ran: list[int]
) -> None:
    schedule = make(overlap="allow", **policy)
    services.materialise(now=T0 + timedelta(minutes=10, seconds=2))  # the beat was down for ten slots
    slots = rows(schedule)
    assert sorted(slots) == [T0 + timedelta(minutes=m) for m in range(1, 11)]
    assert run_slots(schedule) == [T0 + timedelta(minutes=m) for m in ran]
    assert {slots[T0 + timedelta(minutes=m)] for m in range(1, 11) if m not in ran} == {("skipped", "catch_up")}


def test_skip_runs_nothing_late_and_latest_runs_the_newest_missed_slot_once() -> None:
    skip, latest = make("skip", cron="@hourly", catch_up="skip"), make("latest", cron="@hourly", catch_up="latest")
    services.materialise(now=T0 + timedelta(hours=1, seconds=61))  # 13:00 is 61 s late
    assert run_slots(skip) == []
    assert rows(skip) == {T0 + timedelta(hours=1): ("skipped", "catch_up")}
    assert run_slots(latest) == [T0 + timedelta(hours=1)]
    services.materialise(now=T0 + timedelta(hours=2, seconds=1))
    assert run_slots(skip) == [T0 + timedelta(hours=2)]


def test_overlap_skip_never_starts_a_second_run_and_records_the_skipped_slots() -> None:
    schedule = make(interval_seconds=1, cron="", overlap="skip")
    for second in range(1, 8):  # the first run stays queued (its "body" runs 3 s): slots 2-3 overlap
        services.materialise(now=T0 + second * SECOND)
        if second == 3:
            finish_runs(schedule)
    states = rows(schedule)
    assert [states[T0 + s * SECOND] for s in range(1, 8)] == [
        ("enqueued", ""),
        ("skipped", "overlap"),
        ("skipped", "overlap"),
        ("enqueued", ""),
        ("skipped", "overlap"),
        ("skipped", "overlap"),
        ("skipped", "overlap"),
    ]
    live = Job.objects.filter(correlation_id=f"schedule:{schedule.pk}").exclude(state__in=["succeeded", "failed", "cancelled"])
    assert live.count() == 1


def test_overlap_buffer_one_keeps_one_waiting_and_enqueues_it_when_the_run_ends() -> None:
    schedule = make(interval_seconds=1, cron="", overlap="buffer_one")
    for second in range(1, 5):
        services.materialise(now=T0 + second * SECOND)
    states = rows(schedule)
    assert [states[T0 + s * SECOND][0] for s in range(1, 5)] == ["enqueued", "buffered", "skipped", "skipped"]
    finish_runs(schedule)  # the run ends: the next tick enqueues the buffered slot, even with no slot due
    services.materialise(now=T0 + 4.5 * SECOND)
    assert rows(schedule)[T0 + 2 * SECOND] == ("enqueued", "")
    assert Occurrence.objects.filter(schedule=schedule, state="buffered").count() == 0


@pytest.mark.parametrize(
    ("zone", "day", "expected_daily"),
    [
        ("Europe/Paris", datetime(2026, 3, 29), ["2026-03-29T03:00:00+02:00"]),
        ("Europe/Paris", datetime(2026, 10, 25), ["2026-10-25T02:30:00+02:00"]),
        ("America/New_York", datetime(2026, 3, 8), ["2026-03-08T03:00:00-04:00"]),
        ("America/New_York", datetime(2026, 11, 1), ["2026-11-01T02:30:00-05:00"]),
    ],
)
def test_dst_days_with_a_daily_0230_and_an_hourly_schedule(zone: str, day: datetime, expected_daily: list[str]) -> None:
    tz = ZoneInfo(zone)
    start = day.replace(tzinfo=tz).astimezone(UTC) - timedelta(hours=1)
    daily = make("daily", now=start, cron="30 2 * * *", zone=zone, overlap="allow")
    hourly = make("hourly", now=start, cron="@hourly", zone=zone, overlap="allow")
    tick_every(daily, start, start + timedelta(hours=26), timedelta(minutes=10))
    day_of = [s for s in run_slots(daily) if s.astimezone(tz).date() == day.date()]
    assert [s.astimezone(tz).isoformat() for s in day_of] == expected_daily
    hours = [s for s in run_slots(hourly) if s.astimezone(tz).date() == day.date()]
    # Each real hour of the day once: 23 on spring-forward day, 25 on fall-back day.
    midnight = datetime(day.year, day.month, day.day, tzinfo=tz)
    length = ((midnight + timedelta(days=1)).astimezone(UTC) - midnight.astimezone(UTC)) // timedelta(hours=1)
    assert length == (23 if day.month == 3 else 25)
    assert len(hours) == len(set(hours)) == length
    assert all(b - a == timedelta(hours=1) for a, b in pairwise(hours))


def test_editing_a_schedule_takes_effect_on_the_next_tick_without_rerunning_past_slots() -> None:
    schedule = make(overlap="allow")
    tick_every(schedule, T0, T0 + timedelta(minutes=2), timedelta(seconds=30))
    services.update_schedule(schedule_id=schedule.pk, actor="ops", now=T0 + timedelta(minutes=2, seconds=30), cron="*/5 * * * *")
    tick_every(schedule, T0 + timedelta(minutes=2, seconds=30), T0 + timedelta(minutes=11), timedelta(seconds=30))
    assert run_slots(schedule) == [T0 + timedelta(minutes=m) for m in (1, 2, 5, 10)]
    assert AuditEvent.objects.filter(action="schedule.update", target_id=str(schedule.pk)).count() == 1


def test_pause_stops_new_slots_at_once_and_resume_applies_the_catch_up_policy_as_previewed() -> None:
    schedule = make(catch_up="all_within", catch_up_window_seconds=150, catch_up_max=10, overlap="allow")
    services.materialise(now=T0 + timedelta(minutes=1))
    services.pause_schedule(schedule_id=schedule.pk, actor="ops", reason="maintenance", now=T0 + timedelta(minutes=1, seconds=1))
    services.materialise(now=T0 + timedelta(minutes=6))
    assert run_slots(schedule) == [T0 + timedelta(minutes=1)]
    services.resume_schedule(schedule_id=schedule.pk, actor="ops", now=T0 + timedelta(minutes=6))
    preview = selectors.preview_catch_up(schedule_id=schedule.pk, now=T0 + timedelta(minutes=6))
    assert preview.enqueue == [T0 + timedelta(minutes=m) for m in (4, 5, 6)]
    assert [slot for slot, _ in preview.skipped] == [T0 + timedelta(minutes=m) for m in (2, 3)]
    assert Occurrence.objects.filter(schedule=schedule).count() == 1, "a preview writes nothing"
    services.materialise(now=T0 + timedelta(minutes=6))
    assert run_slots(schedule) == [T0 + timedelta(minutes=m) for m in (1, 4, 5, 6)]
    actions = list(AuditEvent.objects.filter(target_type="schedule", target_id=str(schedule.pk)).values_list("action", flat=True))
    assert {"schedule.pause", "schedule.resume"} <= set(actions)


@pytest.mark.django_db(transaction=True)
def test_pause_on_failure_after_n_failed_runs_in_a_row() -> None:
    from tests.inprocess import run_until

    schedule = make(kind="terminal", overlap="allow", pause_on_failures=2)
    for minute in (1, 2):
        services.materialise(now=T0 + timedelta(minutes=minute))
        job_id = Occurrence.objects.get(schedule=schedule, slot_at=T0 + timedelta(minutes=minute)).job_id
        assert job_id is not None
        run_until(job_id, "failed")
    services.materialise(now=T0 + timedelta(minutes=3))
    schedule.refresh_from_db()
    assert schedule.paused and schedule.paused_by == "schedule" and "2 failed runs in a row" in schedule.paused_reason
    assert run_slots(schedule) == [T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"cron": "every day"}, "must have 5 fields"),
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"zone": "Europe/Atlantis"}, "unknown time zone"),
        ({"cron": "", "interval_seconds": 0}, "above 0"),
        ({"cron": "", "interval_seconds": -1}, "above 0"),
        ({"starts_at": T0, "ends_at": T0 - SECOND}, "ends_at must be later"),
        ({"kind": "no.such.kind"}, "no.such.kind"),
        ({"catch_up": "all_within"}, "needs catch_up_window_seconds"),
        ({"overlap": "sometimes"}, "overlap is skip"),
    ],
)
def test_bad_input_is_refused_clearly_and_changes_no_row(values: dict[str, Any], complaint: str) -> None:
    existing = make("existing")
    before = (Schedule.objects.count(), AuditEvent.objects.count(), list(Schedule.objects.values()))
    with pytest.raises(ScheduleError, match=complaint):
        make("bad", **values)
    with pytest.raises(ScheduleError, match=complaint):
        services.update_schedule(schedule_id=existing.pk, actor="ops", **values)
    assert (Schedule.objects.count(), AuditEvent.objects.count(), list(Schedule.objects.values())) == before


def test_run_now_is_a_manual_audited_slot_beside_the_rules_slots() -> None:
    schedule = make()
    occurrence = services.run_now(schedule_id=schedule.pk, actor="ops", now=T0 + timedelta(seconds=30))
    assert occurrence.state == "manual" and Job.objects.filter(pk=occurrence.job_id or 0, created_by="ops").exists()
    assert AuditEvent.objects.filter(action="schedule.run_now", target_id=str(schedule.pk)).count() == 1
    # The manual run is live (queued): the rule's next slot overlaps it (overlap skip).
    services.materialise(now=T0 + timedelta(minutes=1))
    assert rows(schedule)[T0 + timedelta(minutes=1)] == ("skipped", "overlap")
    finish_runs(schedule)
    services.materialise(now=T0 + timedelta(minutes=2))
    assert run_slots(schedule) == [T0 + timedelta(minutes=2)]


def test_backfill_is_previewed_bounded_and_runs_only_slots_that_never_ran() -> None:
    schedule = make(catch_up="skip", overlap="allow")
    services.materialise(now=T0 + timedelta(minutes=5, seconds=1))  # 1-4 skipped, 5 ran
    start, end = T0 + timedelta(minutes=1), T0 + timedelta(minutes=5)
    preview = services.backfill(
        schedule_id=schedule.pk, actor="ops", start=start, end=end, dry_run=True, now=T0 + timedelta(minutes=6)
    )
    assert preview.run == [T0 + timedelta(minutes=m) for m in (1, 2, 3, 4)]
    assert preview.already == [(T0 + timedelta(minutes=5), "enqueued")]
    assert run_slots(schedule) == [T0 + timedelta(minutes=5)], "a dry run writes nothing"
    done = services.backfill(
        schedule_id=schedule.pk, actor="ops", start=start, end=end, dry_run=False, now=T0 + timedelta(minutes=6)
    )
    assert len(done.job_ids) == 4 and run_slots(schedule) == [T0 + timedelta(minutes=m) for m in range(1, 6)]
    with pytest.raises(ScheduleError, match="more than 100 slots"):
        services.backfill(schedule_id=schedule.pk, actor="ops", start=T0 - timedelta(days=1), end=T0, dry_run=True, now=T0)
    with pytest.raises(ScheduleError, match="past slots only"):
        services.backfill(schedule_id=schedule.pk, actor="ops", start=T0, end=T0 + timedelta(hours=1), dry_run=True, now=T0)


def test_slots_a_backfill_ran_ahead_of_the_materialiser_are_decided_once_and_passed() -> None:
    schedule = make(overlap="allow")
    services.pause_schedule(schedule_id=schedule.pk, actor="ops", reason="backfill first", now=T0)
    services.backfill(
        schedule_id=schedule.pk,
        actor="ops",
        start=T0,
        end=T0 + timedelta(minutes=3),
        dry_run=False,
        now=T0 + timedelta(minutes=3),
    )
    services.resume_schedule(schedule_id=schedule.pk, actor="ops", now=T0 + timedelta(minutes=3))
    services.materialise(now=T0 + timedelta(minutes=3, seconds=5))
    schedule.refresh_from_db()
    assert schedule.last_slot_at == T0 + timedelta(minutes=3) and schedule.next_slot_at == T0 + timedelta(minutes=4)
    assert [state for state, _ in rows(schedule).values()] == ["backfill"] * 4  # T0 is a slot of the rule too
    assert services.materialise(now=T0 + timedelta(minutes=3, seconds=10)).schedules == 0, "nothing due: not picked again"
