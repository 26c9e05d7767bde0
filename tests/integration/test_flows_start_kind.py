"""``flow.start`` (flows/kinds.py): a job that starts a workflow run, and so a schedule of runs.
Bodies run in the test process (tests/inprocess.py) against real PostgreSQL and Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from flows import services as flows
from flows.models import Run
from schedules import services as schedules
from schedules.errors import ScheduleError
from schedules.models import Schedule
from tests.inprocess import drain_until
from workers.errors import EnqueueError
from workers.models import Job
from workers.services.jobs import enqueue


@pytest.mark.django_db(transaction=True)  # the body is claimed: committed rows
def test_a_flow_start_job_starts_one_run_and_its_key_finds_that_run_again(tmp_path: Path) -> None:
    job_id = enqueue(kind="flow.start", input={"workflow": "fan", "input": {"log": str(tmp_path / "log")}}).job_id
    job = drain_until(lambda: Job.objects.filter(pk=job_id, state="succeeded").first(), what="the flow.start job")
    assert job is not None and isinstance(job.result, dict)
    assert job.result["created"] is True
    run = Run.objects.get(pk=job.result["run_id"])
    assert (run.definition, run.version, run.input) == ("fan", 2, {"log": str(tmp_path / "log")})
    assert Run.objects.count() == 1
    # An attempt that ran again (a crash after the run's commit) starts it with the same key: the same run.
    again = flows.start_run(definition="fan", input=run.input, idempotency_key=f"flow.start:job:{job_id}", actor="test")
    assert (again.run.pk, again.created) == (run.pk, False)
    assert Run.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"workflow": "no_such_flow"}, "no workflow named 'no_such_flow'"),
        ({"workflow": "fan", "version": 9, "input": {"log": "x"}}, "has no version 9"),
        ({"workflow": "fan", "input": {}}, "missing required field(s): log"),
        ({"workflow": "fan", "input": ["log"]}, "'input' must be an object"),
        ({"workflow": "fan", "version": "1", "input": {"log": "x"}}, "'version' must be an integer"),
        ({"workflow": "fan", "input": {"log": "x"}, "extra": 1}, "unknown field(s) extra"),
        ({}, "workflow"),
    ],
)
def test_a_flow_start_for_a_workflow_that_cannot_start_is_refused_at_enqueue(data: dict[str, object], says: str) -> None:
    with pytest.raises(EnqueueError, match=None) as refused:
        enqueue(kind="flow.start", input=data)
    assert says in str(refused.value)
    assert not Job.objects.exists() and not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_schedule_of_flow_start_starts_a_run_at_its_slot(tmp_path: Path) -> None:
    now = timezone.now().replace(microsecond=0)
    schedule = schedules.create_schedule(
        name="fan-each-minute",
        actor="ops",
        now=now - timedelta(minutes=1),
        kind="flow.start",
        input={"workflow": "fan", "version": 1, "input": {"log": str(tmp_path / "log")}},
        cron="* * * * *",
        zone="UTC",
    )
    schedules.materialise(now=now + timedelta(seconds=1))
    job = Job.objects.get(kind="flow.start")
    assert str(job.idempotency_key).startswith(f"schedule:{schedule.pk}:")
    drain_until(lambda: Job.objects.filter(pk=job.pk, state="succeeded").first(), what="the scheduled flow.start job")
    run = Run.objects.get()
    assert (run.definition, run.version) == ("fan", 1)


@pytest.mark.django_db
def test_a_schedule_of_an_unknown_workflow_is_refused_and_nothing_is_stored() -> None:
    with pytest.raises(ScheduleError, match="no workflow named 'no_such_flow'"):
        schedules.create_schedule(
            name="broken-flow",
            actor="ops",
            now=datetime(2026, 6, 1, tzinfo=UTC),
            kind="flow.start",
            input={"workflow": "no_such_flow"},
            cron="0 8 * * *",
            zone="UTC",
        )
    assert not Schedule.objects.exists()
