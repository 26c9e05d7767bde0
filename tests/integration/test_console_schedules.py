"""The console's schedule pages and the admin's, through Django's test client: every role reads
them, only operators act (pause, resume, run now, backfill previewed then confirmed), each action
audited, bad input a message that changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from koala.models import AuditEvent
from schedules import services
from schedules.models import Occurrence, Schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def schedule() -> Schedule:
    created = services.create_schedule(
        name="weekday-report",
        actor="setup",
        kind="noop",
        cron="0 9 * * 1-5",
        zone="Europe/Paris",
        now=timezone.now() - timedelta(days=7),
        catch_up="latest",
    )
    return created


def act(client: Client, schedule: Schedule, **data: str) -> int:
    return client.post(f"/admin/console/schedules/{schedule.pk}/act/", data).status_code


def test_every_role_reads_the_pages_with_the_rule_in_words_and_next_fires(clients: dict[str, Client], schedule: Schedule) -> None:
    for role in ("operator", "reviewer", "auditor"):
        listing = clients[role].get("/admin/console/schedules/")
        assert listing.status_code == 200 and "At 09:00 on Monday through Friday, Europe/Paris" in listing.content.decode()
        page = clients[role].get(f"/admin/console/schedules/{schedule.pk}/")
        html = page.content.decode()
        assert page.status_code == 200
        assert html.count("T09:00:00+0") == 10, "the next 10 fires in the schedule's zone"
        assert "T07:00:00+00:00" in html or "T08:00:00+00:00" in html, "and in UTC"
        # A week of missed weekday slots: the preview says what the next tick would fire (latest).
        assert "What the next tick would fire now" in html and "skipped (catch_up)" in html
    assert clients["norole"].get("/admin/console/schedules/").status_code == 403
    assert clients["operator"].get("/admin/console/schedules/999999/").status_code == 404


def test_only_operators_act_and_each_action_is_audited(clients: dict[str, Client], schedule: Schedule) -> None:
    for role in ("reviewer", "auditor", "norole"):
        assert act(clients[role], schedule, action="run_now") == 403
    assert not Occurrence.objects.exists()
    operator = clients["operator"]
    assert act(operator, schedule, action="pause", reason="") == 302
    schedule.refresh_from_db()
    assert not schedule.paused, "a pause without a reason is refused"
    assert act(operator, schedule, action="pause", reason="quarter close") == 302
    schedule.refresh_from_db()
    assert schedule.paused and schedule.paused_by == "olga"
    page = operator.get(f"/admin/console/schedules/{schedule.pk}/").content.decode()
    assert "What a resume would fire now" in page and 'id="resume"' in page
    assert act(operator, schedule, action="resume") == 302
    assert act(operator, schedule, action="run_now") == 302
    assert Occurrence.objects.filter(schedule=schedule, state="manual").count() == 1
    actions = set(AuditEvent.objects.filter(target_type="schedule", actor="olga").values_list("action", flat=True))
    assert actions == {"schedule.pause", "schedule.resume", "schedule.run_now"}


def test_backfill_is_previewed_then_confirmed(clients: dict[str, Client], schedule: Schedule) -> None:
    operator = clients["operator"]
    end = timezone.now() - timedelta(days=1)
    start = end - timedelta(days=3)
    preview = operator.post(
        f"/admin/console/schedules/{schedule.pk}/act/", {"action": "backfill", "start": start.isoformat(), "end": end.isoformat()}
    )
    html = preview.content.decode()
    assert preview.status_code == 200 and 'id="backfill-confirm"' in html
    assert not Occurrence.objects.exists(), "the preview wrote nothing"
    count = html.count("<li>run ")
    assert 1 <= count <= 3
    done = operator.post(
        f"/admin/console/schedules/{schedule.pk}/act/",
        {"action": "backfill", "start": start.isoformat(), "end": end.isoformat(), "confirm": "yes"},
    )
    assert done.status_code == 302
    assert Occurrence.objects.filter(schedule=schedule, state="backfill").count() == count
    assert AuditEvent.objects.filter(action="schedule.backfill", actor="olga").count() == 1
    refused = operator.post(
        f"/admin/console/schedules/{schedule.pk}/act/",
        {"action": "backfill", "start": "yesterday", "end": end.isoformat()},
        follow=True,
    )
    assert "is not a time" in refused.content.decode()


def test_the_admin_explains_the_rule_and_edits_through_the_services(admin_client: Client, schedule: Schedule) -> None:
    listing = admin_client.get("/admin/schedules/schedule/")
    assert "At 09:00 on Monday through Friday, Europe/Paris" in listing.content.decode()
    change = admin_client.get(f"/admin/schedules/schedule/{schedule.pk}/change/")
    assert change.status_code == 200 and "next fires (zone | utc)" in change.content.decode().lower()
    form = {
        "kind": "noop",
        "input": "{}",
        "queue": "",
        "cron": "not cron",
        "zone": "Europe/Paris",
        "jitter_seconds": "0",
        "catch_up": "latest",
        "overlap": "skip",
    }
    bad = admin_client.post(f"/admin/schedules/schedule/{schedule.pk}/change/", form)
    assert bad.status_code == 200 and "must have 5 fields" in bad.content.decode()
    good = admin_client.post(f"/admin/schedules/schedule/{schedule.pk}/change/", {**form, "cron": "@daily"})
    assert good.status_code == 302, good.content.decode()[:2000]
    schedule.refresh_from_db()
    assert schedule.cron == "@daily"
    assert AuditEvent.objects.filter(action="schedule.update", target_id=str(schedule.pk)).exists()
