"""Reading an export writes nothing.

An export whose job the engine ended on its own (``koala_cancel``, attempts exhausted) reads in its
settled state everywhere a person looks (the console's Exports page, ``koala_export show/list``, the
selectors), computed at read time; only the beat's exports task stores it, and it stores exactly
what the reads showed.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from exports.models import Export, ExportState
from exports.selectors import describe_export, get_export, latest_exports
from tests.support.exports import People, request
from workers import outcomes
from workers.models import FailureReason
from workers.services import leases
from workers.services.jobs import cancel_job
from workers.services.maintenance import safety_tick
from workers.transitions import end_attempt

pytestmark = pytest.mark.django_db(transaction=True)

# A statement that changes rows (SELECT … FOR UPDATE only locks; the audit row of a read is allowed).
WRITE = re.compile(r"^\s*(INSERT\s+INTO|DELETE\s+FROM|UPDATE\s)|\bUPDATE\s+\"?\w+\"?(\s+\w+)?\s+SET\b", re.IGNORECASE)
AUDIT_INSERT = re.compile(r'^\s*INSERT\s+INTO\s+"koala_auditevent"', re.IGNORECASE)


def writes(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if WRITE.search(q["sql"]) and not AUDIT_INSERT.search(q["sql"])]


def ended_by_the_engine(people: People) -> tuple[Export, Export]:
    """One export whose job an operator cancelled with koala_cancel, one whose job gave up."""
    cancelled = request(people)
    assert cancelled.job_id is not None
    cancel_job(job_id=cancelled.job_id, actor="ops", reason="maintenance window")
    failed = request(people)
    assert failed.job_id is not None
    lease = leases.claim_job(job_id=failed.job_id, worker="w", lease_seconds=30)
    assert lease is not None
    ending = outcomes.Fail(reason=FailureReason.ATTEMPTS_EXHAUSTED, error_class="StorageDown", message="storage unreachable")
    assert end_attempt(ending, lease) is None
    return cancelled, failed


def stored(export: Export) -> dict[str, Any]:
    return describe_export(export=Export.objects.select_related("account").get(pk=export.pk))


def test_reads_show_the_settled_state_and_write_nothing(people: People, redis_clean: None) -> None:
    cancelled, failed = ended_by_the_engine(people)
    client = Client()
    client.force_login(people.root)  # a superuser: the console page
    before = {e.pk: stored(e) for e in (cancelled, failed)}
    assert {pk: r["state"] for pk, r in before.items()} == {cancelled.pk: "queued", failed.pk: "queued"}

    with CaptureQueriesContext(connection) as page:
        html = client.get("/admin/console/exports/").content.decode()
    shown = dict(re.findall(r'<tr data-export="(\d+)" data-state="(\w+)">', html))
    assert shown == {str(cancelled.pk): "cancelled", str(failed.pk): "failed"}
    with CaptureQueriesContext(connection) as command:
        out = io.StringIO()
        call_command("koala_export", "show", str(failed.pk), "--user", "alice", stdout=out)
        listed = io.StringIO()
        call_command("koala_export", "list", stdout=listed)
    with CaptureQueriesContext(connection) as selectors:
        read_one = describe_export(export=get_export(export_id=cancelled.pk, user=people.alice))
        read_all = {e.pk: describe_export(export=e) for e in latest_exports(limit=10)}
    assert writes(page) == [] and writes(command) == [] and writes(selectors) == []
    assert {e.pk: stored(e) for e in (cancelled, failed)} == before, "reading changed no export row"

    shown_failed = json.loads(out.getvalue())
    assert (shown_failed["state"], shown_failed["failure_code"], shown_failed["error"]) == (
        "failed",
        "attempts_exhausted",
        "storage unreachable",
    )
    assert (read_one["state"], read_one["failure_code"], read_one["error"]) == ("cancelled", "", "maintenance window")
    assert {json.loads(line)["id"]: json.loads(line)["state"] for line in listed.getvalue().splitlines()} == {
        cancelled.pk: "cancelled",
        failed.pk: "failed",
    }

    # The beat's exports task stores the outcome, and it is exactly what the reads showed.
    assert safety_tick().tasks["exports"]["settled"] == 2
    after = {e.pk: stored(e) for e in (cancelled, failed)}
    assert after == {cancelled.pk: read_one, failed.pk: shown_failed} == {pk: read_all[pk] for pk in after}
    assert Export.objects.get(pk=cancelled.pk).state == ExportState.CANCELLED
    assert safety_tick().tasks["exports"]["settled"] == 0
