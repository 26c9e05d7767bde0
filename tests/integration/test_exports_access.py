"""Who may create, see, cancel and download an export (test 7), through the service, the
management command and the download view; and the request-time checks of scope and limits."""

from __future__ import annotations

import hashlib
import io
import json
import re
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from exports.errors import ExportError, ExportNotReady, ExportObjectMissing, ExportPermissionDenied
from exports.models import Export, ExportState
from exports.selectors import get_export
from exports.services import cancel_export, open_download, request_export, settle_exports
from koala.models import AuditEvent
from tests.inprocess import run_export
from tests.support.exports import People, load_events, request
from workers.models import Job
from workers.services.jobs import cancel_job

# Plain django_db for requests, access checks and commands; the tests that run the export's job
# are marked transaction=True (the runtime's claims need committed rows: tests/inprocess.py).
pytestmark = pytest.mark.django_db


def download(client: Client, export: Export) -> Any:
    return client.get(reverse("exports:download", args=[export.pk]))


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
def test_outsider_can_neither_create_nor_download(people: People, export_root: Path, redis_clean: None) -> None:
    with pytest.raises(ExportPermissionDenied, match="mallory may not export data of account acme"):
        request(people, user=people.mallory)
    with pytest.raises(ExportPermissionDenied):
        request(people, user=people.bob)  # a member of another account
    assert not Export.objects.exists() and not Job.objects.exists(), "a refused request leaves nothing behind"

    load_events(people.acme, rows=2_000)
    done = run_export(request(people).pk)
    assert done.state == ExportState.SUCCEEDED
    client = Client()

    assert download(client, done).status_code == 302, "anonymous: sent to log in"
    for outsider in (people.mallory, people.bob):
        client.force_login(outsider)
        response = download(client, done)
        assert response.status_code == 404, "the same answer as for an export that does not exist"
        assert b"id,occurred_at" not in response.content
        with pytest.raises(ExportPermissionDenied):
            open_download(export_id=done.pk, user=outsider)
        with pytest.raises(ExportPermissionDenied):
            get_export(export_id=done.pk, user=outsider)
    client.force_login(people.mallory)
    assert client.get(reverse("exports:download", args=[done.pk + 1000])).status_code == 404

    # Losing membership takes the download away too.
    people.acme.members.remove(people.alice)
    client.force_login(people.alice)
    assert download(client, done).status_code == 404
    downloads = AuditEvent.objects.filter(action="export.download")
    assert not downloads.exists(), "refused downloads read nothing"


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
@pytest.mark.parametrize("who", ["alice", "root"])
def test_member_and_superuser_download_the_published_object(
    people: People, export_root: Path, redis_clean: None, who: str
) -> None:
    load_events(people.acme, rows=3_000)
    done = run_export(request(people).pk)
    client = Client()
    client.force_login(getattr(people, who))
    response = download(client, done)
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert body == (export_root / done.output_key).read_bytes()
    assert hashlib.sha256(body).hexdigest() == done.checksum == response["X-Content-SHA256"]
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Length"] == str(done.bytes)
    assert f'filename="acme-2026-01-01-2026-12-31-export-{done.pk}.csv"' in response["Content-Disposition"]
    audit = AuditEvent.objects.get(action="export.download")
    assert (audit.actor, audit.target_id) == (who, str(done.pk))


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
@pytest.mark.parametrize("who", ["alice", "root"])
def test_a_published_export_whose_object_is_gone_answers_410(
    people: People, export_root: Path, redis_clean: None, who: str
) -> None:
    """Storage lost the object (deleted by hand, a bucket lifecycle rule): a clear 410, never a 500."""
    load_events(people.acme, rows=500)
    done = run_export(request(people).pk)
    (export_root / done.output_key).unlink()
    client = Client(raise_request_exception=False)
    client.force_login(getattr(people, who))
    response = download(client, done)
    assert response.status_code == 410, response.status_code
    text = response.content.decode()
    assert f"export {done.pk}" in text and "no longer in storage" in text and "request a new export" in text
    assert not AuditEvent.objects.filter(action="export.download").exists(), "nothing was read"
    with pytest.raises(ExportObjectMissing):
        open_download(export_id=done.pk, user=getattr(people, who))
    # An outsider still learns nothing: the same 404 as for any export not theirs.
    client.force_login(people.mallory)
    assert download(client, done).status_code == 404


def test_download_of_an_unfinished_export_is_refused(people: People, export_root: Path, redis_clean: None) -> None:
    export = request(people)
    with pytest.raises(ExportNotReady, match="is queued"):
        open_download(export_id=export.pk, user=people.alice)
    client = Client()
    client.force_login(people.alice)
    response = download(client, export)
    assert response.status_code == 409 and b"only a succeeded export" in response.content


def test_request_refuses_scope_and_limits_beyond_the_caps(people: People, settings: Any) -> None:
    settings.KOALA_EXPORT_MAX_DAYS = 31
    settings.KOALA_EXPORT_MAX_ROWS = 1_000
    cases: list[tuple[dict[str, Any], str]] = [
        ({"format": "xlsx"}, "unsupported export format 'xlsx'; supported: csv"),
        ({"date_from": date(2026, 2, 1), "date_to": date(2026, 1, 1)}, "ends (2026-01-01) before it starts"),
        ({"date_from": date(2026, 1, 1), "date_to": date(2026, 2, 28)}, "spans 59 days; the limit is 31 days"),
        ({"date_to": date(2026, 1, 31), "max_rows": 5_000}, "max_rows=5000 is beyond the limit of 1000"),
        ({"date_to": date(2026, 1, 31), "max_rows": 0}, "max_rows must be positive"),
        ({"date_to": date(2026, 1, 31), "time_limit_seconds": -1}, "time_limit_seconds must be positive"),
    ]
    for options, message in cases:
        with pytest.raises(ExportError, match=re.escape(message)):
            request(people, **options)
    assert not Export.objects.exists() and not Job.objects.exists()
    made = request(people, date_to=date(2026, 1, 31))
    assert (made.max_rows, made.max_bytes) == (1_000, settings.KOALA_EXPORT_MAX_BYTES), "defaults are the caps"


def test_request_records_scope_requester_and_audit(people: People, redis_clean: None) -> None:
    export = request_export(
        user=people.alice,
        account_id=people.acme.pk,
        date_from=date(2026, 1, 1),
        date_to=date(2026, 1, 31),
        max_rows=500,
        max_bytes=10_000,
        time_limit_seconds=30,
    )
    export.refresh_from_db()
    assert (export.state, export.requested_by, export.requested_by_name) == (ExportState.QUEUED, people.alice, "alice")
    assert (export.max_rows, export.max_bytes, export.time_limit_seconds) == (500, 10_000, 30)
    assert export.output_key == f"exports/{export.pk}/export-{export.pk}.csv"
    job = Job.objects.get(pk=export.job_id)
    assert (job.kind, job.queue, job.input, job.idempotency_key) == (
        "export.csv",
        "exports",
        {"export_id": export.pk},
        f"export-{export.pk}",
    )
    audit = AuditEvent.objects.get(action="export.request")
    assert (audit.actor, audit.target_id, audit.details["account"]) == ("alice", str(export.pk), "acme")


def test_only_people_who_may_see_it_cancel_it(people: People, export_root: Path, redis_clean: None) -> None:
    export = request(people)
    with pytest.raises(ExportPermissionDenied):
        cancel_export(export_id=export.pk, user=people.mallory)
    assert Export.objects.get(pk=export.pk).state == ExportState.QUEUED
    cancelled = cancel_export(export_id=export.pk, user=people.alice, reason="wrong range")
    assert (cancelled.state, cancelled.error_message) == (ExportState.CANCELLED, "wrong range")
    assert Job.objects.get(pk=export.job_id).state == "cancelled"
    with pytest.raises(ExportError, match="already cancelled"):
        cancel_export(export_id=export.pk, user=people.alice)


def test_engine_decided_outcomes_are_settled_into_the_export(people: People, redis_clean: None) -> None:
    """An operator cancels the job itself (koala_cancel): the export follows."""
    export = request(people)
    cancel_job(job_id=export.job_id, actor="ops", reason="maintenance")
    assert Export.objects.get(pk=export.pk).state == ExportState.QUEUED
    assert settle_exports() == 1
    assert Export.objects.get(pk=export.pk).state == ExportState.CANCELLED
    assert settle_exports() == 0


# The management command ---------------------------------------------------------------------
def test_koala_export_command_creates_shows_and_cancels(people: People, export_root: Path, redis_clean: None) -> None:
    out = io.StringIO()
    call_command(
        "koala_export", "create", "--user", "alice", "--account", "acme", "--from", "2026-01-01", "--to", "2026-03-31", stdout=out
    )
    export_id = int(out.getvalue().strip())
    export = Export.objects.get(pk=export_id)
    assert (export.account, export.date_from, export.date_to, export.requested_by) == (
        people.acme,
        date(2026, 1, 1),
        date(2026, 3, 31),
        people.alice,
    )
    with pytest.raises(CommandError, match="mallory may not export data of account acme"):
        call_command(
            "koala_export", "create", "--user", "mallory", "--account", "acme", "--from", "2026-01-01", "--to", "2026-01-02"
        )
    with pytest.raises(CommandError, match="is not a date"):
        call_command(
            "koala_export", "create", "--user", "alice", "--account", "acme", "--from", "01/02/2026", "--to", "2026-01-02"
        )
    with pytest.raises(CommandError, match="account 'nope' does not exist"):
        call_command(
            "koala_export", "create", "--user", "alice", "--account", "nope", "--from", "2026-01-01", "--to", "2026-01-02"
        )
    with pytest.raises(CommandError, match="may not see exports"):
        call_command("koala_export", "show", str(export_id), "--user", "mallory")
    shown = io.StringIO()
    call_command("koala_export", "show", str(export_id), "--user", "alice", stdout=shown)
    assert '"state": "queued"' in shown.getvalue() and '"account": "acme"' in shown.getvalue()
    listed = io.StringIO()
    call_command("koala_export", "list", stdout=listed)
    assert [json.loads(line)["id"] for line in listed.getvalue().splitlines()] == [export_id]
    cancelled = io.StringIO()
    call_command("koala_export", "cancel", str(export_id), "--user", "alice", stdout=cancelled)
    assert cancelled.getvalue().strip() == f"export {export_id} is cancelled"
    assert Export.objects.count() == 1


def test_clean_removes_temp_objects_of_ended_exports_only(people: People, export_root: Path, redis_clean: None) -> None:
    ended, running = request(people), request(people)
    cancel_export(export_id=ended.pk, user=people.alice)
    for export in (ended, running):
        folder = export_root / "tmp" / str(export.pk)
        folder.mkdir(parents=True)
        (folder / "7-deadbeef.csv.part").write_bytes(b"partial")
    out = io.StringIO()
    call_command("koala_export", "clean", stdout=out)
    assert out.getvalue().strip() == "removed 1 temporary object(s)"
    assert not any((export_root / "tmp" / str(ended.pk)).iterdir())
    assert any((export_root / "tmp" / str(running.pk)).iterdir()), "a running export's temp file is its attempt's"


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
def test_failed_export_stays_inspectable_in_the_admin_without_customer_data(
    people: People, export_root: Path, redis_clean: None
) -> None:
    load_events(people.acme, rows=3_000)
    failed = run_export(request(people, max_rows=1_000).pk)
    done = run_export(request(people).pk)
    client = Client()
    client.force_login(people.root)
    listing = client.get("/admin/exports/export/")
    page = client.get(f"/admin/exports/export/{failed.pk}/change/")
    assert listing.status_code == 200 and page.status_code == 200
    html = page.content.decode()
    assert "row_limit_exceeded" in html and "more than its limit of 1000 rows" in html
    assert "u-0" not in html and "coupon" not in html, "an export record never shows the exported rows"
    assert reverse("exports:download", args=[done.pk]) in client.get(f"/admin/exports/export/{done.pk}/change/").content.decode()
    # Read-only: changes go through the services.
    assert client.post(f"/admin/exports/export/{failed.pk}/change/", {"state": "succeeded"}).status_code == 403
    assert Export.objects.get(pk=failed.pk).state == ExportState.FAILED
