"""The console's Exports page and export jobs in the job pages.

Real exports, run in this process by the real runtime against real PostgreSQL, Redis and a
private storage folder: the page shows their records redacted, offers Download only to the
people the export services let download, lets operators cancel through the export service,
and no console path retries an export job (a failed export is retried by requesting a new one).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from exports.models import Export, ExportState
from exports.services import cancel_export, grant_account_access
from koala.models import AuditEvent
from tests.inprocess import run_export
from tests.support.console_scenarios import failed_job_with_secrets
from tests.support.exports import People, load_events, request
from workers.models import Job

# Plain django_db for the page and its actions; the tests that run an export's job are marked
# transaction=True (the runtime's claims need committed rows: tests/inprocess.py).
pytestmark = pytest.mark.django_db

PAGE = "/admin/console/exports/"
TOKEN = "tok_live_abcdefgh12345678"  # credential-shaped: the redaction layer masks it


def rows(html: str) -> dict[int, tuple[str, str]]:
    """The page's export rows: id -> (state, the row's HTML)."""
    found = re.findall(r'<tr data-export="(\d+)" data-state="(\w+)">(.*?)</tr>', html, flags=re.DOTALL)
    return {int(pk): (state, body) for pk, state, body in found}


def download_url(export: Export) -> str:
    return f"/exports/{export.pk}/download/"


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def succeeded(people: People, export_root: Path, redis_clean: None) -> Export:
    load_events(people.acme, rows=2_000)
    done = run_export(request(people).pk)
    assert done.state == ExportState.SUCCEEDED, (done.failure_code, done.error_message)
    return done


@pytest.mark.django_db(transaction=True)  # runs an export's job (tests/inprocess.py)
def test_the_page_lists_the_newest_exports_with_their_records_redacted(
    succeeded: Export, people: People, clients: dict[str, Client]
) -> None:
    failed = run_export(request(people, max_rows=10).pk)
    assert (failed.state, failed.failure_code) == (ExportState.FAILED, "row_limit_exceeded")
    cancelled = request(people)
    cancel_export(export_id=cancelled.pk, user=people.alice, reason=f"wrong range, see {TOKEN}")
    # The cancel reason is stored redacted; plant the raw token anyway (a row written before that
    # rule, or by SQL) to show the page redacts again on the way out.
    assert TOKEN not in Export.objects.get(pk=cancelled.pk).error_message
    Export.objects.filter(pk=cancelled.pk).update(error_message=f"wrong range, see {TOKEN}")
    queued = request(people, user=people.bob, account_id=people.globex.pk)

    response = clients["auditor"].get(PAGE)
    assert response.status_code == 200
    html = response.content.decode()
    assert TOKEN not in html
    listed = rows(html)
    assert list(listed) == [queued.pk, cancelled.pk, failed.pk, succeeded.pk], "newest first"
    assert {pk: state for pk, (state, _) in listed.items()} == {
        queued.pk: "queued",
        cancelled.pk: "cancelled",
        failed.pk: "failed",
        succeeded.pk: "succeeded",
    }

    done = listed[succeeded.pk][1]
    assert "acme" in done and "2026-01-01 \u2013 2026-12-31" in done and ">csv<" in done and ">alice<" in done
    assert f">{succeeded.row_count}<" in done and f'title="{succeeded.bytes} bytes"' in done
    assert f">{succeeded.checksum[:12]}…</code>" in done
    assert f"{succeeded.compute_seconds:.3f} / {succeeded.db_wait_seconds:.3f} / {succeeded.storage_wait_seconds:.3f} s" in done
    assert f'href="/admin/console/jobs/{succeeded.job_id}/"' in done

    assert "row_limit_exceeded" in listed[failed.pk][1] and "more than its limit of 10 rows" in listed[failed.pk][1]
    assert f'href="/admin/console/jobs/{failed.job_id}/"' in listed[failed.pk][1]
    assert "wrong range, see [redacted]" in listed[cancelled.pk][1]
    assert "globex" in listed[queued.pk][1] and ">bob<" in listed[queued.pk][1]
    assert AuditEvent.objects.filter(actor="aude", action="read", target_type="export_list").exists()


def test_every_role_reads_the_page_and_nobody_else_does(
    people: People, clients: dict[str, Client], role_users: dict[str, User], redis_clean: None
) -> None:
    export = request(people)
    for role in ("operator", "reviewer", "auditor"):
        response = clients[role].get(PAGE)
        assert response.status_code == 200, role
        assert export.pk in rows(response.content.decode()), role
        # Linked from the console's navigation and from the admin index, like the other pages.
        assert f'href="{PAGE}"' in clients[role].get("/admin/console/jobs/").content.decode(), role
        assert f'href="{PAGE}"' in clients[role].get("/admin/").content.decode(), role
    assert clients["norole"].get(PAGE).status_code == 403
    assert clients["norole"].post(PAGE).status_code == 403
    assert f'href="{PAGE}"' not in clients["norole"].get("/admin/").content.decode()
    for outsider in (clients["anonymous"], logged_in(people.alice)):  # alice: the account's member, not staff
        response = outsider.get(PAGE)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    # Reading the page changes nothing and needs no POST.
    assert clients["auditor"].post(PAGE).status_code == 405
    assert Export.objects.get(pk=export.pk).state == ExportState.QUEUED


@pytest.mark.django_db(transaction=True)  # runs an export's job (tests/inprocess.py)
def test_download_is_offered_only_to_people_the_export_services_let_download(
    succeeded: Export, people: People, clients: dict[str, Client], role_users: dict[str, User]
) -> None:
    failed = run_export(request(people, max_rows=10).pk)
    url = download_url(succeeded)
    # Olga operates the console but is no member of acme; Aude audits and is one; root is a superuser.
    grant_account_access(account_id=people.acme.pk, username="aude", actor="setup")
    offered = {
        "olga": url in clients["operator"].get(PAGE).content.decode(),
        "rita": url in clients["reviewer"].get(PAGE).content.decode(),
        "aude": url in clients["auditor"].get(PAGE).content.decode(),
        "root": url in logged_in(people.root).get(PAGE).content.decode(),
    }
    assert offered == {"olga": False, "rita": False, "aude": True, "root": True}
    # The link is exactly as good as the download view says: it works for those who see it…
    response = clients["auditor"].get(url)
    assert response.status_code == 200 and response["X-Content-SHA256"] == succeeded.checksum
    assert clients["operator"].get(url).status_code == 404  # …and not for the others.
    # Never for an export that did not succeed, whoever looks.
    for client in (clients["auditor"], logged_in(people.root)):
        assert download_url(failed) not in client.get(PAGE).content.decode()


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
def test_the_admin_export_page_offers_download_only_to_people_the_download_view_allows(
    succeeded: Export, people: People, clients: dict[str, Client], role_users: dict[str, User]
) -> None:
    """The admin's export page (read-only for every role) follows the same rule as the console's."""
    url = download_url(succeeded)
    change = f"/admin/exports/export/{succeeded.pk}/change/"
    grant_account_access(account_id=people.acme.pk, username="aude", actor="setup")
    viewers = {"olga": clients["operator"], "rita": clients["reviewer"], "aude": clients["auditor"]}
    viewers["root"] = logged_in(people.root)
    for name, client in viewers.items():
        page = client.get(change)
        assert page.status_code == 200, name
        offered = f'href="{url}"' in page.content.decode()
        allowed = client.get(url).status_code == 200
        assert offered == allowed, (name, offered, allowed)
    assert f'href="{url}"' not in clients["operator"].get(change).content.decode()
    assert f'href="{url}"' in clients["auditor"].get(change).content.decode()
    # What the others read instead of a link that would answer 404.
    assert "members of acme and superusers" in clients["operator"].get(change).content.decode()
    # The requester, too, is a link only for people who may open user pages (the roles may not).
    requester = f'href="/admin/auth/user/{people.alice.pk}/change/"'
    assert requester not in clients["operator"].get(change).content.decode()
    assert clients["operator"].get(f"/admin/auth/user/{people.alice.pk}/change/").status_code == 403
    assert requester in logged_in(people.root).get(change).content.decode()


def test_operators_cancel_through_the_export_service(
    people: People, clients: dict[str, Client], role_users: dict[str, User], redis_clean: None
) -> None:
    export = request(people)
    cancel = f"/admin/console/exports/{export.pk}/cancel/"
    for role in ("reviewer", "auditor", "norole"):
        assert f'action="{cancel}"' not in clients[role].get(PAGE).content.decode(), role
        assert clients[role].post(cancel, {"reason": "no"}).status_code == 403, role
    assert clients["operator"].get(cancel).status_code == 405

    # An operator who is not a member of the account: the button is disabled with the reason,
    # and the export service refuses the POST anyway.
    page = rows(clients["operator"].get(PAGE).content.decode())[export.pk][1]
    assert f'action="{cancel}"' not in page and "disabled" in page and "only members of acme" in page
    refused = clients["operator"].post(cancel, {"reason": "no"}, follow=True)
    assert "Olga may not see exports of account acme" in refused.content.decode()
    assert Export.objects.get(pk=export.pk).state == ExportState.QUEUED
    assert not AuditEvent.objects.filter(action="export.cancel").exists()

    grant_account_access(account_id=people.acme.pk, username="olga", actor="setup")
    assert f'action="{cancel}"' in clients["operator"].get(PAGE).content.decode()
    done = clients["operator"].post(cancel, {"reason": "wrong range"}, follow=True)
    assert f"Export {export.pk} cancelled" in done.content.decode()
    export.refresh_from_db()
    assert (export.state, export.error_message) == (ExportState.CANCELLED, "wrong range")
    assert Job.objects.get(pk=export.job_id).state == "cancelled"
    assert AuditEvent.objects.filter(action="export.cancel", actor="olga", target_id=str(export.pk)).exists()
    # Ended: no button any more, and a second POST is refused by the service.
    assert f'action="{cancel}"' not in clients["operator"].get(PAGE).content.decode()
    again = clients["operator"].post(cancel, {}, follow=True)
    assert "already cancelled" in again.content.decode()


def test_the_csrf_token_is_needed_to_cancel(people: People, role_users: dict[str, User], redis_clean: None) -> None:
    export = request(people, user=people.root)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people.root)
    assert strict.post(f"/admin/console/exports/{export.pk}/cancel/", {}).status_code == 403
    assert Export.objects.get(pk=export.pk).state == ExportState.QUEUED


@pytest.mark.django_db(transaction=True)  # runs an export's job (tests/inprocess.py)
def test_export_jobs_are_not_offered_retry_and_the_server_refuses_it(
    people: People, export_root: Path, clients: dict[str, Client], redis_clean: None
) -> None:
    load_events(people.acme, rows=500)
    failed = run_export(request(people, max_rows=10).pk)
    export_job = failed.job_id
    assert export_job is not None and Job.objects.get(pk=export_job).state == "failed"
    other = failed_job_with_secrets().pk  # an ordinary failed job: still retried

    detail = clients["operator"].get(f"/admin/console/jobs/{export_job}/").content.decode()
    assert 'value="retry"' not in detail and 'id="retry-hint"' in detail and "request a new export" in detail
    assert 'value="retry"' in clients["operator"].get(f"/admin/console/jobs/{other}/").content.decode()
    listing = clients["operator"].get("/admin/console/jobs/?kind=export.csv").content.decode()
    assert 'option value="retry"' not in listing and "no retry: request a new one" in listing
    assert 'option value="retry"' in clients["operator"].get("/admin/console/jobs/").content.decode()

    one = clients["operator"].post(f"/admin/console/jobs/{export_job}/act/", {"action": "retry"}, follow=True)
    assert f"Job {export_job} is an export.csv job and is not retried: request a new export instead" in one.content.decode()
    assert not Job.objects.filter(retry_of_id=export_job).exists()

    bulk = clients["operator"].post(
        "/admin/console/jobs/bulk/", {"action": "retry", "scope": "selected", "ids": [str(export_job), str(other)]}, follow=True
    )
    html = bulk.content.decode()
    assert "Retried: 1 job(s)." in html and f"Job {export_job} is an export.csv job and is not retried" in html
    assert not Job.objects.filter(retry_of_id=export_job).exists()
    assert Job.objects.filter(retry_of_id=other).count() == 1

    every = clients["operator"].post(
        "/admin/console/jobs/bulk/", {"action": "retry", "scope": "all", "kind": "export.csv", "state": "failed"}, follow=True
    )
    assert "is not retried" in every.content.decode()
    assert not Job.objects.filter(retry_of_id=export_job).exists()
    assert not AuditEvent.objects.filter(action="retry", target_id=str(export_job)).exists()
    assert Export.objects.count() == 1, "refusing a retry requests no export either"


# -- requesting an export in the browser ---------------------------------------------------------

REQUEST = "/admin/console/exports/new/"


def console_member(people: People) -> Client:
    """Alice with a console role (auditors: read-only), still a member of acme alone."""
    people.alice.is_staff = True
    people.alice.save()
    people.alice.groups.add(*User.objects.get(username="aude").groups.all())
    return logged_in(people.alice)


@pytest.mark.django_db(transaction=True)  # runs the export's job (tests/inprocess.py)
def test_a_member_requests_an_export_from_the_exports_page(
    people: People, role_users: dict[str, User], export_root: Path, redis_clean: None
) -> None:
    alice = console_member(people)
    page = alice.get(PAGE).content.decode()
    form = re.search(r'<form method="post" action="/admin/console/exports/new/".*?</form>', page, re.S)
    assert form, "the page offers the request form"
    options = re.findall(r'<option value="(\d+)"[^>]*>([^<]+)</option>', form.group(0))
    assert options == [(str(people.acme.pk), "acme")]  # only the accounts she may export
    done = alice.post(REQUEST, {"account": people.acme.pk, "date_from": "2026-01-01", "date_to": "2026-03-31"}, follow=True)
    export = Export.objects.get()
    assert (export.account, export.requested_by, str(export.date_from), str(export.date_to)) == (
        people.acme,
        people.alice,
        "2026-01-01",
        "2026-03-31",
    )
    assert export.state == ExportState.QUEUED and Job.objects.get(pk=export.job_id).kind == "export.csv"
    assert f"Export {export.pk} of acme requested" in done.content.decode()
    assert export.pk in rows(done.content.decode())
    audit = AuditEvent.objects.get(action="export.request", target_id=str(export.pk))
    assert audit.actor == "alice" and audit.details["account"] == "acme"
    # The export runs like any other: its member downloads it.
    load_events(people.acme, rows=100)
    assert run_export(export.pk).state == ExportState.SUCCEEDED
    assert alice.get(download_url(export)).status_code == 200


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"account": "globex", "date_from": "2026-01-01", "date_to": "2026-01-31"}, "alice may not export data of account"),
        ({"account": "acme", "date_from": "2026-03-01", "date_to": "2026-01-31"}, "the date range ends (2026-01-31) before"),
        ({"account": "acme", "date_from": "2026-01-01", "date_to": "2027-06-30"}, "the limit is 366 days"),
        ({"account": "acme", "date_from": "2026-13-01", "date_to": "2026-01-31"}, "Enter a valid date"),
        ({"account": "acme", "date_from": "", "date_to": "2026-01-31"}, "This field is required"),
        ({"account": "acme", "date_from": "2026-01-01", "date_to": "2026-01-31", "max_rows": "0"}, "max_rows"),
        ({"account": "acme", "date_from": "2026-01-01", "date_to": "2026-01-31", "max_rows": "1e9"}, "Enter a whole number"),
        ({"account": "999999", "date_from": "2026-01-01", "date_to": "2026-01-31"}, "account 999999 does not exist"),
        ({"account": "x\x00", "date_from": "2026-01-01", "date_to": "2026-01-31"}, ""),
    ],
)
def test_a_bad_request_says_why_and_creates_nothing(
    people: People, role_users: dict[str, User], redis_clean: None, data: dict[str, str], said: str
) -> None:
    alice = console_member(people)
    accounts = {"acme": people.acme.pk, "globex": people.globex.pk}
    data = {**data, "account": str(accounts.get(data["account"], data["account"]))}
    response = alice.post(REQUEST, data)
    assert response.status_code == 400
    assert said in response.content.decode().replace("&#x27;", "'")
    assert not Export.objects.exists() and not Job.objects.exists()
    assert not AuditEvent.objects.filter(action="export.request").exists()


def test_only_console_staff_may_post_a_request_and_the_service_decides_the_account(
    people: People, clients: dict[str, Client], role_users: dict[str, User], redis_clean: None
) -> None:
    data = {"account": people.acme.pk, "date_from": "2026-01-01", "date_to": "2026-01-31"}
    assert clients["norole"].post(REQUEST, data).status_code == 403
    assert clients["anonymous"].post(REQUEST, data)["Location"].startswith("/admin/login/")
    assert clients["operator"].get(REQUEST).status_code == 405
    # An operator who is a member of no account: the page says so, and a POST is refused.
    page = clients["operator"].get(PAGE).content.decode()
    assert "members of an account (and superusers) request its exports" in page and 'name="date_from"' not in page
    assert "olga may not export data of account acme" in clients["operator"].post(REQUEST, data).content.decode()
    assert not Export.objects.exists()
    # A superuser may export any account.
    root = logged_in(people.root)
    assert root.post(REQUEST, data).status_code == 302
    assert Export.objects.get().requested_by == people.root
