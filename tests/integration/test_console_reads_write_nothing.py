"""Reading is not writing: no console page, engine admin page or read command changes a row.

Every GET of a console page and of the admin's engine and export pages runs SELECTs only, plus
the read's own audit row (a person reading run data is audited, R19). Reads are selectors;
writes are services, and the beat does the periodic settling (exports, reviews).
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from devtools.sandbox.provider import FakeProvider
from tests.support.console_scenarios import failed_job_with_secrets, pending_review, uncertain_charge
from tests.support.exports import People, request
from workers.services.budgets import create_budget
from workers.services.jobs import cancel_job, enqueue
from workers.services.pauses import pause

pytestmark = pytest.mark.django_db(transaction=True)

WRITE = re.compile(r"^\s*(INSERT\s+INTO|DELETE\s+FROM|UPDATE\s)|\bUPDATE\s+\"?\w+\"?(\s+\w+)?\s+SET\b", re.IGNORECASE)
AUDIT_INSERT = re.compile(r'^\s*INSERT\s+INTO\s+"koala_auditevent"', re.IGNORECASE)


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if WRITE.search(q["sql"]) and not AUDIT_INSERT.search(q["sql"])]


def test_no_read_writes(people: People, provider: FakeProvider, settings: Any, redis_clean: None) -> None:
    failed = failed_job_with_secrets().pk
    review = pending_review(requested_by="someone-else").pk
    operation = uncertain_charge(provider, settings).pk
    enqueue(kind="noop", input={}, queue="bulk")  # no worker serves "bulk" here
    pause(scope="kind", target="demo.flaky", reason="testing", actor="setup")
    budget = create_budget(name="daily", scope="global", spend_limit_minor=10_000, actor="setup").pk
    export = request(people)  # its job cancelled with koala_cancel: the export is settled by the beat, not by a read
    assert export.job_id is not None
    cancel_job(job_id=export.job_id, actor="ops", reason="maintenance")

    client = Client()
    client.force_login(people.root)
    pages = [
        "/admin/console/",
        "/admin/console/jobs/",
        "/admin/console/jobs/?state=failed&kind=boom",
        f"/admin/console/jobs/{failed}/",
        f"/admin/console/jobs/{export.job_id}/",
        "/admin/console/failures/",
        "/admin/console/exports/",
        "/admin/console/pauses/",
        "/admin/console/attention/",
        "/admin/console/budgets/",
        f"/admin/console/budgets/{budget}/",
        "/admin/console/reviews/",
        f"/admin/console/reviews/{review}/",
        "/admin/workers/job/",
        f"/admin/workers/job/{failed}/change/",
        "/admin/workers/attempt/",
        f"/admin/workers/operation/{operation}/change/",
        "/admin/exports/export/",
        f"/admin/exports/export/{export.pk}/change/",
    ]
    found = {}
    for url in pages:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200, url
        found[url] = writes(captured)
    for command in (
        ("koala_job", str(failed), "--actor", "cli"),
        ("koala_jobs",),
        ("koala_export", "show", str(export.pk), "--user", "root"),
        ("koala_export", "list"),
        ("koala_beat", "--status"),
        ("koala_tick", "--list"),
        ("koala_status",),
        ("koala_status", "--json"),
    ):
        with (
            CaptureQueriesContext(connection) as captured,
            contextlib.suppress(CommandError),
        ):  # exit 1/2 when unhealthy
            call_command(*command, stdout=io.StringIO())
        found[" ".join(command)] = writes(captured)
    assert {where: statements for where, statements in found.items() if statements} == {}
