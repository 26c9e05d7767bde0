"""When a schedule's slots fall, in 20 zones over a year with DST: the next fire is always strictly
later, no slot comes twice, and the documented DST rule (schedules/timing.py, docs/schedules.md)
holds at every transition of 2026 in each zone.

Walking all 525,600 minutes of the year in 20 zones takes minutes, so every minute is walked
where DST can matter (six hours around each transition) and 2,000 seeded random minutes of the
rest of the year are checked in each zone.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice
from zoneinfo import ZoneInfo

import pytest

from schedules.timing import Timing, TimingError, check, explain

ZONES = [
    "Europe/Paris",
    "Europe/London",
    "Europe/Chisinau",  # changes at 02:00/03:00 local, not 01:00 UTC
    "America/New_York",
    "America/Chicago",
    "America/Denver",
    "America/Los_Angeles",
    "America/St_Johns",  # -03:30
    "America/Havana",  # changes at midnight: a whole 00:xx hour is skipped
    "America/Santiago",  # southern hemisphere, changes at 24:00
    "America/Sao_Paulo",  # no DST any more
    "Australia/Sydney",
    "Australia/Adelaide",  # +09:30/+10:30
    "Australia/Lord_Howe",  # a 30-minute DST shift
    "Pacific/Auckland",
    "Pacific/Chatham",  # +12:45/+13:45
    "Asia/Jerusalem",
    "Africa/Cairo",
    "Asia/Kolkata",  # no DST
    "UTC",
]
YEAR_START = datetime(2026, 1, 1, tzinfo=UTC)
YEAR_END = datetime(2027, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@cache
def transitions(zone: str) -> list[tuple[datetime, timedelta, timedelta]]:
    """Each change of the zone's UTC offset in 2026: (the instant, offset before, offset after)."""
    tz = ZoneInfo(zone)
    found = []
    moment = YEAR_START
    offset = moment.astimezone(tz).utcoffset()
    while moment < YEAR_END:
        step = moment + timedelta(minutes=15)
        after = step.astimezone(tz).utcoffset()
        if after != offset:
            low, high = moment, step  # narrow to the minute
            while high - low > MINUTE:
                mid = low + (high - low) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(tz).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            assert offset is not None and after is not None
            found.append((high, offset, after))
            offset = after
        moment = step
    return found


def minutes(start: datetime, end: datetime) -> list[datetime]:
    count = int((end - start) / MINUTE)
    return [start + index * MINUTE for index in range(count)]


def test_the_zones_have_the_transitions_this_test_expects() -> None:
    # If tzdata changes under us, this says so rather than the rule tests passing on nothing.
    counts = {zone: len(transitions(zone)) for zone in ZONES}
    assert sum(1 for count in counts.values() if count == 2) >= 15, counts
    assert counts["UTC"] == counts["Asia/Kolkata"] == counts["America/Sao_Paulo"] == 0


@pytest.mark.parametrize("zone", ZONES)
def test_every_minute_around_each_transition_is_one_slot_strictly_later(zone: str) -> None:
    timing = Timing(zone=zone, cron="* * * * *")
    for instant, _, _ in transitions(zone):
        start = instant - timedelta(hours=3)
        expected = minutes(start + MINUTE, instant + timedelta(hours=3))
        walked = list(islice(timing.after(start), len(expected)))
        # Every real minute is a slot (each wall minute matches "* * * * *"), once, in order.
        assert walked == expected, zone


@pytest.mark.parametrize("zone", ZONES)
def test_next_fire_is_strictly_later_and_never_repeats_over_the_year(zone: str) -> None:
    rng = random.Random(zone)
    for cron in ("*/7 * * * *", "30 2 * * *", "0 * * * *", "15 0 * * 1-5", "@monthly"):
        timing = Timing(zone=zone, cron=cron)
        for _ in range(400):
            moment = YEAR_START + timedelta(minutes=rng.randrange(525_600), seconds=rng.random() * 60)
            first, second, third = islice(timing.after(moment), 3)
            assert moment < first < second < third
            # Asking from a slot gives the next one: the walk and the single step agree.
            assert timing.next_after(first) == second
            assert timing.next_after(first - timedelta(microseconds=1)) == first


def local_day_slots(timing: Timing, day: datetime) -> list[datetime]:
    """The slots whose wall date (in the timing's zone) is ``day``'s date."""
    tz = timing.tz
    start = datetime(day.year, day.month, day.day, tzinfo=tz) - timedelta(days=1)
    out: list[datetime] = []
    for slot in timing.after(start.astimezone(UTC)):
        local = slot.astimezone(tz).date()
        if local > day.date():
            return out
        if local == day.date():
            out.append(slot)
    return out


@pytest.mark.parametrize("zone", ZONES)
def test_a_fixed_time_in_a_skipped_or_repeated_hour_fires_once_as_documented(zone: str) -> None:
    tz = ZoneInfo(zone)
    seen = {"skipped": 0, "exists": 0}
    for instant, before, after in transitions(zone):
        shift = after - before
        wall_before = (instant - MINUTE).astimezone(tz) + MINUTE  # the wall clock the change leaves
        # Every 15 minutes of the affected wall times, and the quarter hours just around them.
        affected = abs(shift)
        for quarter in range(-1, int(affected / timedelta(minutes=15)) + 1):
            wall = (
                wall_before.replace(tzinfo=None) if shift > timedelta(0) else (wall_before - affected).replace(tzinfo=None)
            ) + quarter * timedelta(minutes=15)
            timing = Timing(zone=zone, cron=f"{wall.minute} {wall.hour} * * *")
            slots = local_day_slots(timing, wall)
            assert len(slots) == 1, (zone, wall, slots)
            first = wall.replace(tzinfo=tz, fold=0)
            if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall:
                # The wall time does not exist (spring-forward): it fires at the first valid time after it.
                assert slots[0] == instant, (zone, wall, slots)
                seen["skipped"] += 1
            else:
                # It exists, maybe twice (fall-back): it fires once, on its first pass (fold 0).
                assert slots[0] == first.astimezone(UTC), (zone, wall, slots)
                seen["exists"] += 1
    # Both halves of the rule were exercised wherever the zone changes its clock.
    assert bool(seen["skipped"]) == bool(transitions(zone)) == bool(seen["exists"]), seen


def test_paris_and_new_york_examples_of_the_rule() -> None:
    paris = ZoneInfo("Europe/Paris")
    daily = Timing(zone="Europe/Paris", cron="30 2 * * *")
    assert [s.astimezone(paris).isoformat() for s in daily.upcoming(datetime(2026, 3, 28, 12, tzinfo=paris), 2)] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    assert [s.astimezone(paris).isoformat() for s in daily.upcoming(datetime(2026, 10, 24, 12, tzinfo=paris), 2)] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    new_york = ZoneInfo("America/New_York")
    hourly = Timing(zone="America/New_York", cron="@hourly")
    assert [s.astimezone(new_york).isoformat() for s in hourly.upcoming(datetime(2026, 11, 1, 0, 30, tzinfo=new_york), 4)] == [
        "2026-11-01T01:00:00-04:00",
        "2026-11-01T01:00:00-05:00",  # the repeated hour: a wildcard hour fires in each real hour
        "2026-11-01T02:00:00-05:00",
        "2026-11-01T03:00:00-05:00",
    ]
    assert [s.astimezone(new_york).isoformat() for s in hourly.upcoming(datetime(2026, 3, 8, 0, 30, tzinfo=new_york), 3)] == [
        "2026-03-08T01:00:00-05:00",
        "2026-03-08T03:00:00-04:00",  # 02:00 never shows on the clock
        "2026-03-08T04:00:00-04:00",
    ]


def test_an_interval_counts_real_seconds_from_its_anchor() -> None:
    anchor = datetime(2026, 3, 29, 0, 0, 7, tzinfo=UTC)
    timing = Timing(zone="Europe/Paris", interval_seconds=3600, anchor=anchor)
    assert timing.upcoming(anchor - timedelta(seconds=1), 3) == [anchor + timedelta(hours=h) for h in range(3)]
    assert timing.next_after(anchor + timedelta(minutes=30)) == anchor + timedelta(hours=1)
    bounded = Timing(zone="UTC", interval_seconds=60, anchor=anchor, starts_at=anchor, ends_at=anchor + timedelta(minutes=2))
    assert list(bounded.after(anchor - timedelta(days=1))) == [
        anchor,
        anchor + timedelta(minutes=1),
        anchor + timedelta(minutes=2),
    ]


@pytest.mark.parametrize(
    ("timing", "complaint"),
    [
        (Timing(zone="Europe/Paris", cron="61 * * * *"), "invalid cron expression"),
        (Timing(zone="Europe/Paris", cron="* * * *"), "must have 5 fields"),
        (Timing(zone="Europe/Paris", cron="@fortnightly"), "unknown cron alias"),
        (Timing(zone="Mars/Olympus", cron="@daily"), "unknown time zone"),
        (Timing(zone="", cron="@daily"), "needs an IANA time zone"),
        (Timing(zone="UTC", interval_seconds=0), "above 0"),
        (Timing(zone="UTC", interval_seconds=-5), "above 0"),
        (Timing(zone="UTC"), "either a cron expression or an interval"),
        (Timing(zone="UTC", cron="@daily", interval_seconds=60), "either a cron expression or an interval"),
        (Timing(zone="UTC", cron="@daily", starts_at=YEAR_END, ends_at=YEAR_START), "ends_at must be later"),
    ],
)
def test_bad_timing_is_refused_with_a_reason(timing: Timing, complaint: str) -> None:
    with pytest.raises(TimingError, match=complaint):
        check(timing)


def test_the_rule_in_words() -> None:
    assert explain(Timing(zone="Europe/Paris", cron="0 9 * * 1-5")) == "At 09:00 on Monday through Friday, Europe/Paris"
    assert explain(Timing(zone="UTC", cron="@daily")) == "At 00:00 every day, UTC"
    assert explain(Timing(zone="UTC", interval_seconds=90)) == "Every 90 seconds"
    assert explain(Timing(zone="UTC", interval_seconds=7200)) == "Every 2 hours"
