"""A kind's handle enqueues its own kind and version, against real PostgreSQL and Redis.

``send_invoice.enqueue(input, key=…)`` is committed when it returns (another connection sees
it); inside the caller's transaction it commits, and rings, with that transaction or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

import tests.kinds
import workers
from koala.models import AuditEvent
from tests.dburl import libpq_params
from workers import doorbell
from workers.models import Job

# services: a second connection, built from the connection settings, sees what is committed.
pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def rings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every doorbell ring, as (queue, [(job id, version)]), in order (the real ring still happens)."""
    seen: list[tuple[str, list[tuple[int, int]]]] = []
    real = doorbell.ring

    def ring(queue: str, jobs: list[tuple[int, int]]) -> Any:
        seen.append((queue, list(jobs)))
        return real(queue, jobs)

    monkeypatch.setattr(doorbell, "ring", ring)
    return seen


@pytest.fixture
def elsewhere() -> Iterator[psycopg.Connection[Any]]:
    """A second connection to the test database: what a worker would see."""
    with psycopg.connect(**libpq_params(connection.settings_dict), autocommit=True) as other:
        yield other


def seen_from(other: psycopg.Connection[Any], job_id: int) -> bool:
    return other.execute("SELECT 1 FROM workers_job WHERE id = %s", [job_id]).fetchone() is not None


def test_enqueue_is_committed_when_it_returns_and_rings_at_once(
    redis_clean: None, rings: list[Any], elsewhere: psycopg.Connection[Any]
) -> None:
    created = tests.kinds.transient.enqueue({"n": 1}, key="handle-1", priority=5)
    assert seen_from(elsewhere, created.job_id)  # committed before enqueue returned
    assert rings == [("default", [(created.job_id, 1)])]
    job = Job.objects.get(pk=created.job_id)
    assert (job.kind, job.version, job.input, job.idempotency_key, job.priority) == ("transient", 1, {"n": 1}, "handle-1", 5)
    again = tests.kinds.transient.enqueue({"n": 1}, key="handle-1")
    assert (again.job_id, again.created) == (created.job_id, False)
    with pytest.raises(workers.EnqueueError, match="different input"):
        tests.kinds.transient.enqueue({"n": 2}, key="handle-1")
    assert Job.objects.count() == 1


def test_inside_the_callers_transaction_it_commits_and_rings_with_it(
    redis_clean: None, rings: list[Any], elsewhere: psycopg.Connection[Any]
) -> None:
    with transaction.atomic():
        created = tests.kinds.transient.enqueue({"n": 1})
        assert not seen_from(elsewhere, created.job_id)  # part of the caller's transaction …
        assert rings == []  # … and no worker is rung for a row it could not see
    assert seen_from(elsewhere, created.job_id)
    assert rings == [("default", [(created.job_id, 1)])]

    with pytest.raises(RuntimeError, match="the caller changed its mind"), transaction.atomic():
        undone = tests.kinds.transient.enqueue({"n": 2})
        raise RuntimeError("the caller changed its mind")
    assert not Job.objects.filter(pk=undone.job_id).exists() and len(rings) == 1  # no job, no ring


def test_a_handle_enqueues_its_own_version_not_the_latest(redis_clean: None) -> None:
    assert (tests.kinds.versioned_v1.version, tests.kinds.versioned_v2.version) == (1, 2)
    old = tests.kinds.versioned_v1.enqueue()
    by_name = workers.enqueue(kind="versioned")  # by name: the latest version
    assert Job.objects.get(pk=old.job_id).version == 1
    assert Job.objects.get(pk=by_name.job_id).version == 2


def test_enqueue_many_takes_inputs_and_specs_in_one_transaction(redis_clean: None, rings: list[Any]) -> None:
    handle = tests.kinds.transient
    results = handle.enqueue_many([{"n": 1}, handle.spec({"n": 2}, key="many-2", delay_seconds=3600), {"n": 3}])
    jobs = [Job.objects.get(pk=r.job_id) for r in results]
    assert [j.input for j in jobs] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [j.idempotency_key for j in jobs] == [None, "many-2", None]
    assert rings == [("default", [(results[0].job_id, 1), (results[2].job_id, 1)])]  # the delayed one is not due
    with pytest.raises(workers.EnqueueError, match="must be a JSON object"):
        handle.enqueue_many([{"n": 4}, ["not", "an", "object"]])  # type: ignore[list-item]
    assert Job.objects.count() == 3  # all or nothing


def test_the_roots_enqueue_many_mixes_kinds_through_their_specs(redis_clean: None) -> None:
    first, second = workers.enqueue_many(
        specs=[tests.kinds.transient.spec({"n": 1}), tests.kinds.versioned_v1.spec({}, key="mixed")]
    )
    jobs = [Job.objects.get(pk=result.job_id) for result in (first, second)]
    assert [(j.kind, j.version, j.idempotency_key) for j in jobs] == [("transient", 1, None), ("versioned", 1, "mixed")]


def test_a_remote_kinds_handle_enqueues_and_a_person_is_audited(redis_clean: None) -> None:
    echo = workers.remote_kind("http.echo", version=1, queue="default", max_attempts=3, timeout_seconds=60.0)
    created = echo.enqueue({"hello": "handle"}, created_by="alice")
    job = Job.objects.get(pk=created.job_id)
    assert (job.kind, job.version, job.created_by) == ("http.echo", 1, "alice")
    assert AuditEvent.objects.filter(actor="alice", action="enqueue", target_id=str(created.job_id)).exists()
