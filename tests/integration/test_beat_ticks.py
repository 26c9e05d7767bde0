"""The beat's tick, step by step: a step that fails is logged, counted and retried next tick,
and never keeps the others (dispatch above all) from running; each step's last tick is a
``BeatTask`` row that ``koala_beat --status`` judges."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.inprocess import beat_tick
from workers import doorbell, hooks
from workers.models import BeatTask
from workers.services.jobs import enqueue
from workers.services.maintenance import beat_tick as tick

# transaction=True: the beat commits each step as it goes, as in its own process.
pytestmark = pytest.mark.django_db(transaction=True)


class Broken(RuntimeError):
    pass


@pytest.fixture
def broken_task() -> Iterator[list[int]]:
    """An app's beat task that raises on every tick (registered through the public hook)."""
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        raise Broken("the app's housekeeping is broken")

    hooks.register_beat_task("broken", run)
    yield calls
    hooks.unregister_beat_task("broken")


def status() -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("koala_beat", "--status", stdout=out)
    except CommandError as exc:
        return 1, out.getvalue() + str(exc)
    return 0, out.getvalue()


def test_a_failing_beat_task_never_keeps_dispatch_from_ringing_due_jobs(redis_clean: None, broken_task: list[int]) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    doorbell.redis_connection().flushdb()  # Redis lost the message: only dispatch can ring it again
    with pytest.raises(CommandError, match="broken failed"):  # --once says a step failed (exit 1) …
        beat_tick()
    assert broken_task == [1]
    assert [m.args for m in doorbell.rq_queue("default").jobs] == [(job_id, 1)], "… and dispatch rang the due job"
    broken = BeatTask.objects.get(name="broken")
    assert (broken.consecutive_failures, broken.failures, broken.last_error) == (1, 1, "Broken")
    assert broken.last_succeeded_at is None and broken.last_failed_at is not None
    dispatched = BeatTask.objects.get(name="dispatch")
    assert dispatched.last_succeeded_at is not None and dispatched.consecutive_failures == 0
    # The tasks after the broken one ran too (apps registered after it, the engine's steps).
    ran = set(BeatTask.objects.values_list("name", flat=True))
    assert {"reap", "pauses", "budgets", "breakers", "reviews", "exports", "traces", "flows", "schedules", "dispatch"} <= ran

    # Retried next tick, and counted again.
    with pytest.raises(CommandError):
        beat_tick()
    assert broken_task == [1, 1]
    broken.refresh_from_db()
    assert (broken.consecutive_failures, broken.failures) == (2, 2)
    code, said = status()
    assert code == 1 and "broken" in said and "FAILING" in said, said

    # Fixed: a success resets the run of failures, keeps the count and the last error class.
    hooks.register_beat_task("broken", lambda: {"fixed": 1})
    beat_tick()
    broken.refresh_from_db()
    assert (broken.consecutive_failures, broken.failures, broken.last_error) == (0, 2, "Broken")
    assert broken.last_succeeded_at is not None and broken.last_succeeded_at >= broken.last_failed_at  # type: ignore[operator]
    code, said = status()
    assert code == 0, said


def test_status_says_a_beat_that_stopped_is_stale(redis_clean: None) -> None:
    code, said = status()
    assert code == 1 and "never" in said, "nothing ever ran: every step is stale"
    beat_tick()
    assert status()[0] == 0
    # The beat stopped ten minutes ago (as its rows would say).
    BeatTask.objects.update(last_succeeded_at=timezone.now() - timedelta(minutes=10))
    code, said = status()
    assert code == 1 and "dispatch" in said and "STALE" in said, said


def test_replicas_write_a_success_about_once_per_interval_and_share_retention(redis_clean: None) -> None:
    """Two replicas on one tick interval: the second's successes within the interval are not
    written again; retention's pass is claimed by one of them only."""
    first = tick(prune_due=True, interval_seconds=60, beat="host-a:1")
    assert "retention" in first.steps and first.recorded
    written = dict(BeatTask.objects.values_list("name", "beat"))
    assert set(written.values()) == {"host-a:1"}
    second = tick(prune_due=True, interval_seconds=60, beat="host-b:2")
    assert "retention" not in second.steps, "the pass was claimed by the first replica within the interval"
    assert "dispatch" in second.steps and second.recorded
    assert dict(BeatTask.objects.values_list("name", "beat")) == written, "successes within the interval: no write"
    # A failure is always written, whichever replica sees it.
    hooks.register_beat_task("broken", lambda: 1 / 0)
    try:
        tick(prune_due=False, interval_seconds=60, beat="host-b:2")
    finally:
        hooks.unregister_beat_task("broken")
    assert BeatTask.objects.get(name="broken").last_error == "ZeroDivisionError"
    assert BeatTask.objects.get(name="broken").beat == "host-b:2"


def test_an_app_cannot_take_a_name_of_the_beats_own_steps() -> None:
    with pytest.raises(ValueError, match="dispatch"):
        hooks.register_beat_task("dispatch", lambda: 0)


def test_the_dashboard_shows_each_steps_last_tick(redis_clean: None, client, broken_task: list[int]) -> None:  # type: ignore[no-untyped-def]
    from django.contrib.auth.models import User

    from tests.support.console import ensure_roles

    with pytest.raises(CommandError):
        beat_tick()
    ensure_roles()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/console/").content.decode()
    table = page[page.index('id="beat"') :]
    assert '<tr data-status="failing">\n      <th scope="row">broken</th>' in table
    assert '<tr data-status="ok">\n      <th scope="row">dispatch</th>' in table
    assert "Broken" in table
