"""Three real koala_beat replicas and a schedule firing every second: exactly one job per slot
and no slot missing; then one replica is killed with SIGKILL mid-run and the other two go on
with the same guarantee (its open transaction, if any, rolls back: no half-written slot)."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
from django.utils import timezone

from schedules import services
from schedules.models import Occurrence, Schedule
from tests.conftest import wait_for
from workers.models import Job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUN_SECONDS = 20


def check_every_slot_ran_once(schedule: Schedule, until: datetime) -> list[datetime]:
    occurrences = list(Occurrence.objects.filter(schedule=schedule, slot_at__lte=until).order_by("slot_at"))
    slots = [o.slot_at for o in occurrences]
    assert slots, "no slot was materialised"
    assert all(b - a == timedelta(seconds=1) for a, b in pairwise(slots)), "a slot is missing or doubled"
    assert {o.state for o in occurrences} == {"enqueued"}, {o.state for o in occurrences}
    job_ids = [o.job_id for o in occurrences if o.job_id is not None]
    assert len(set(job_ids)) == len(job_ids) == len(occurrences)
    jobs = Job.objects.filter(correlation_id=f"schedule:{schedule.pk}", pk__in=job_ids)
    keys = sorted(str(key) for key in jobs.values_list("idempotency_key", flat=True))
    assert keys == sorted(services.idempotency_key(schedule_id=schedule.pk, slot=s) for s in slots)
    return slots


def test_three_beats_one_job_per_slot_then_one_killed(processes, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    schedule = services.create_schedule(
        name="every-second",
        actor="test",
        kind="noop",
        interval_seconds=1,
        zone="UTC",
        overlap="allow",
        # Every slot within a minute runs, so a replica's late tick never drops one.
        catch_up="all_within",
        catch_up_window_seconds=60,
        catch_up_max=120,
    )
    beats = [processes.beat() for _ in range(3)]
    time.sleep(RUN_SECONDS)
    first = check_every_slot_ran_once(schedule, timezone.now() - timedelta(seconds=2))
    assert len(first) >= RUN_SECONDS - 8, len(first)  # the beats' start-up takes a few seconds

    os.kill(beats[0].pid, signal.SIGKILL)
    beats[0].wait(timeout=10)
    killed_at = timezone.now()
    time.sleep(RUN_SECONDS / 2)
    wait_for(
        lambda: Occurrence.objects.filter(schedule=schedule, slot_at__gte=killed_at + timedelta(seconds=8)).exists(),
        what="slots after the kill",
    )
    after = check_every_slot_ran_once(schedule, timezone.now() - timedelta(seconds=2))
    assert after[: len(first)] == first
    assert after[-1] >= killed_at + timedelta(seconds=RUN_SECONDS / 2 - 3)
    assert all(beat.poll() is None for beat in beats[1:]), processes.logs()
    assert "beat tick failed" not in processes.logs()
    # The replicas shared the work (SKIP LOCKED): more than one of them materialised slots.
    sharing = [log for log in tmp_path.glob("beat-*.log") if "beat: schedules enqueued=" in log.read_text()]
    assert len(sharing) >= 2, processes.logs()


def test_a_three_second_body_on_a_one_second_schedule_never_overlaps_with_skip(processes) -> None:  # type: ignore[no-untyped-def]
    from workers.models import Attempt

    schedule = services.create_schedule(
        name="slow-body", actor="test", kind="sleep", input={"seconds": 3}, interval_seconds=1, zone="UTC", overlap="skip"
    )
    processes.beat()
    processes.beat()
    processes.worker()
    processes.worker()  # a second worker would run an overlapping job at once if one were enqueued
    wait_for(
        lambda: Job.objects.filter(correlation_id=f"schedule:{schedule.pk}", state="succeeded").count() >= 3,
        timeout=60,
        what="three runs of the slow body",
    )
    services.pause_schedule(schedule_id=schedule.pk, actor="test", reason="enough")
    attempts = list(
        Attempt.objects.filter(job__correlation_id=f"schedule:{schedule.pk}", finished_at__isnull=False).order_by("started_at")
    )
    assert len(attempts) >= 3
    for earlier, later in pairwise(attempts):
        assert earlier.finished_at is not None and earlier.finished_at <= later.started_at, "two runs overlapped"
    skipped = Occurrence.objects.filter(schedule=schedule, state="skipped", reason="overlap").count()
    assert skipped >= 2 * (len(attempts) - 1), skipped  # about two slots skipped per 3-second run
