"""One job as a person sees it: ``workers.selectors.jobs.job_for_person``.

The console's job page, the admin's job page and ``koala_job`` show the same redacted values, and
each read writes exactly one audit row, in the selector. An attempt an operator's requeue took
away says so by a stored fact (``Attempt.requeued_by``), not by the wording of its message.
"""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils.html import escape

from koala.models import AuditEvent
from tests.inprocess import run_until
from tests.planted import Planted, planted
from workers import outcomes
from workers.models import Attempt, Job, Outcome
from workers.selectors.jobs import job_for_person
from workers.services import leases
from workers.services.jobs import cancel_job, enqueue, requeue_job
from workers.transitions import end_attempt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    return client


def reads(job_id: int, actor: str) -> int:
    return AuditEvent.objects.filter(action="read", target_type="job", target_id=str(job_id), actor=actor).count()


def koala_job(job_id: int, actor: str) -> dict[str, Any]:
    out = StringIO()
    call_command("koala_job", str(job_id), "--json", "--actor", actor, stdout=out)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


@pytest.mark.parametrize("ending", ["failed", "cancelled"])
def test_the_console_the_admin_and_koala_job_show_one_view(ending: str, root: Client, redis_clean: None) -> None:
    secrets: Planted = planted()
    job_id = enqueue(kind="leaky", input=secrets.job_input(), created_by="alice").job_id
    if ending == "failed":
        run_until(job_id, "failed")
    else:  # an operator's reason is the job's error, with no error class
        cancel_job(job_id=job_id, actor="ops", reason=f"customer asked; see {secrets.url}")

    view = job_for_person(job_id=job_id, actor="vera")
    assert reads(job_id, "vera") == 1
    assert view.error and secrets.leaks(view.error) == []

    printed = koala_job(job_id, "cleo")
    assert reads(job_id, "cleo") == 1
    assert secrets.leaks(json.dumps(printed)) == []
    assert {key: printed[key] for key in ("input", "progress", "run_state", "result", "usage", "error")} == as_json(
        {
            "input": view.input,
            "progress": view.progress,
            "run_state": view.run_state,
            "result": view.result,
            "usage": view.usage,
            "error": view.error,
        }
    )
    assert [a["error"] for a in printed["attempt_log"]] == [row.error for row in view.attempts]

    console = root.get(f"/admin/console/jobs/{job_id}/").content.decode()
    admin = root.get(f"/admin/workers/job/{job_id}/change/").content.decode()
    assert reads(job_id, "root") == 2, "one audited read per page"
    assert escape(view.error) in console
    for row in view.attempts:
        assert escape(row.error) in console
    assert escape(view.job.error_message) in admin
    assert secrets.leaks(console) == [] and secrets.leaks(admin) == []


def test_a_page_for_a_job_that_does_not_exist_audits_no_read(root: Client) -> None:
    assert root.get("/admin/console/jobs/987654/").status_code == 404
    assert root.get("/admin/workers/job/987654/change/").status_code in (302, 404)  # the admin's "no such object"
    with pytest.raises(Job.DoesNotExist):
        job_for_person(job_id=987654, actor="vera")
    assert not AuditEvent.objects.filter(action="read", target_type="job").exists()


def test_an_operator_requeue_is_stored_and_named_lease_superseded(redis_clean: None) -> None:
    taken = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=taken, worker="stuck", lease_seconds=30)
    assert lease is not None
    requeue_job(job_id=taken, actor="ops")
    attempt = Attempt.objects.get(job_id=taken)
    assert (attempt.outcome, attempt.requeued_by) == (Outcome.INTERRUPTED, "ops")
    assert [row.rejection for row in job_for_person(job_id=taken, actor="vera").attempts] == ["lease_superseded"]

    # Released for another reason whose message happens to read the same: no operator took it.
    released = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=released, worker="w", lease_seconds=30)
    assert lease is not None
    message = "requeued by the provider's lookup window; looking again in 2s"
    assert end_attempt(outcomes.Release(outcome=Outcome.INTERRUPTED, message=message), lease) is None
    attempt = Attempt.objects.get(job_id=released)
    assert (attempt.outcome, attempt.requeued_by, attempt.error_message) == (Outcome.INTERRUPTED, "", message)
    assert [row.rejection for row in job_for_person(job_id=released, actor="vera").attempts] == [None]


def test_attempts_requeued_before_the_column_existed_read_the_same(redis_clean: None) -> None:
    """Migration 0011 copies the operator out of the message of attempts it finds requeued."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    taken = enqueue(kind="noop", input={}).job_id
    assert leases.claim_job(job_id=taken, worker="stuck", lease_seconds=30) is not None
    released = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=released, worker="w", lease_seconds=30)
    assert lease is not None
    end_attempt(outcomes.Release(outcome=Outcome.INTERRUPTED, message="shutdown"), lease)
    executor = MigrationExecutor(connection)
    executor.migrate([("workers", "0010_dashboard_bounded")])
    try:
        with connection.cursor() as cursor:  # what requeue_job wrote before 0011: only the message
            cursor.execute(
                "UPDATE workers_attempt SET outcome = 'interrupted', finished_at = now(), error_message = 'requeued by ops' "
                "WHERE job_id = %s",
                [taken],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(Attempt.objects.filter(job_id__in=[taken, released]).values_list("job_id", "requeued_by")) == {
        taken: "ops",
        released: "",
    }
    assert [row.rejection for row in job_for_person(job_id=taken, actor="vera").attempts] == ["lease_superseded"]
