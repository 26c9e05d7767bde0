"""The engine's hot statements run prepared on every session (workers/prepared.py), and a session
whose prepared statements went missing or went stale recovers by itself."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test import override_settings

from workers import outcomes
from workers.models import Job
from workers.services import leases
from workers.services.jobs import enqueue
from workers.transitions import Ending, end_attempts

pytestmark = pytest.mark.django_db(transaction=True)
SERVED = ["noop@1"]


def prepared_here() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cursor.fetchall()}


def claim() -> leases.Lease | None:
    return leases.claim_next(queue="default", served=SERVED, worker="w-prepared", lease_seconds=30, gated=False)


def test_the_hot_path_runs_prepared_and_ends_as_it_would_unprepared() -> None:
    connection.close()  # a session opened under this test's settings
    ids = [enqueue(kind="noop", input={"i": i}).job_id for i in range(3)]
    got = [claim() for _ in ids]
    assert [lease.job_id for lease in got if lease] == ids
    endings = [Ending(outcomes.Complete(result={"i": i}, state_delta={}), lease) for i, lease in enumerate(got) if lease]
    assert end_attempts(endings) == [None] * 3
    assert {"koala_insert_job", "koala_claim_next", "koala_complete_many"} <= prepared_here()
    assert sorted(Job.objects.filter(id__in=ids).values_list("state", flat=True)) == ["succeeded"] * 3


@override_settings(KOALA_PREPARED_STATEMENTS=False)
def test_turned_off_nothing_is_prepared() -> None:
    connection.close()
    job_id = enqueue(kind="noop", input={}).job_id
    lease = claim()
    assert lease is not None and lease.job_id == job_id
    assert prepared_here() == set()


def test_a_session_whose_statements_were_discarded_fails_one_call_then_prepares_again() -> None:
    # What a pooler's DISCARD ALL (or anyone's DEALLOCATE ALL) does to a session under us.
    connection.close()
    enqueue(kind="noop", input={"i": 1})
    enqueue(kind="noop", input={"i": 2})
    assert "koala_insert_job" in prepared_here()
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(Exception, match="does not exist"):
        enqueue(kind="noop", input={"i": 3})
    assert enqueue(kind="noop", input={"i": 4}).created
    assert "koala_insert_job" in prepared_here()
    assert Job.objects.filter(kind="noop").count() == 3  # the failed call inserted nothing


def test_a_column_added_while_a_session_runs_keeps_its_prepared_claim_working() -> None:
    # The expand step of a rolling deploy: a new column on workers_job under a running worker.
    connection.close()
    first = enqueue(kind="noop", input={"i": 1}).job_id
    assert (lease := claim()) is not None and lease.job_id == first
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE workers_job ADD COLUMN prepared_probe integer")
    try:
        second = enqueue(kind="noop", input={"i": 2}).job_id
        assert (lease := claim()) is not None and lease.job_id == second
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE workers_job DROP COLUMN prepared_probe")


def test_a_prepare_that_fails_inside_a_transaction_leaves_the_transaction_usable() -> None:
    # The table a statement names is missing on this session (a schema not migrated yet): its
    # PREPARE fails under a savepoint, the statement runs as plain text and fails on its own
    # terms, and the caller's transaction goes on after rolling back to its own savepoint.
    connection.close()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE workers_attempt RENAME TO workers_attempt_away")
        with pytest.raises(Exception, match="workers_attempt"), transaction.atomic():
            claim()
        assert "koala_claim_next" not in prepared_here()
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE workers_attempt_away RENAME TO workers_attempt")
        transaction.set_rollback(True)
