"""The console on 100k jobs: a constant number of queries per page (no N+1), pagination, and
pages that stay fast because the filters hit indexes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import Client

# Plain django_db: 100k rows inserted and read back on the test's own connection; the rollback
# removes them, where a transactional test would flush every table.
pytestmark = pytest.mark.django_db

JOBS = 100_000


@pytest.fixture
def many_jobs(role_users: Any) -> Iterator[None]:
    """100k jobs over three kinds, three queues and every state, a quarter with attempts and a
    few failures with messages: inserted in one statement each, as a busy day would leave them."""
    with connection.cursor() as cursor:
        sequences = {}
        for sequence in ("workers_job_id_seq", "workers_attempt_id_seq"):
            cursor.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {sequence}")
            sequences[sequence] = cursor.fetchone()[0]
        cursor.execute(
            """
            INSERT INTO workers_job (kind, version, queue, input, input_fingerprint, state, priority, delivery,
                scheduled_at, attempts, max_attempts, timeout_seconds, lease_token, lease_holder, lease_expires_at,
                progress, run_state, usage, failure_reason, error_class, error_message, park_detail, parked_on,
                correlation_id, trace_id, created_by, created_at, updated_at, finished_at)
            SELECT (ARRAY['noop', 'email.send', 'shop.order_and_charge'])[1 + i %% 3], 1,
                   (ARRAY['default', 'critical', 'bulk'])[1 + (i / 3) %% 3], '{}'::jsonb, md5(i::text),
                   s.state, 0, 'at_least_once', now() - make_interval(secs => i), CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END,
                   3, 30, CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END,
                   CASE WHEN s.state = 'running' THEN 'w1' END, CASE WHEN s.state = 'running' THEN now() + interval '30 s' END,
                   '{}', '{}', '{}', CASE WHEN s.state = 'failed' THEN 'fatal' END,
                   CASE WHEN s.state = 'failed' THEN 'ValueError' ELSE '' END,
                   CASE WHEN s.state = 'failed' THEN 'boom ' || i ELSE '' END, '', '{}', md5(i::text), md5(i::text), '',
                   now() - make_interval(secs => i), now(),
                   CASE WHEN s.state IN ('succeeded', 'failed', 'cancelled') THEN now() - make_interval(secs => i / 2) END
            FROM generate_series(1, %s) AS i,
                 LATERAL (SELECT (ARRAY['queued', 'succeeded', 'succeeded', 'succeeded', 'failed', 'cancelled', 'running'])
                                 [1 + i %% 7] AS state) AS s
            """,
            [JOBS],
        )
        cursor.execute(
            """
            INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, finished_at, outcome,
                error_class, error_message, usage)
            SELECT id, 1, 'w1', 1, created_at, CASE WHEN state = 'running' THEN NULL ELSE coalesce(finished_at, now()) END,
                   CASE WHEN state = 'running' THEN NULL WHEN state = 'failed' THEN 'failed' ELSE 'succeeded' END,
                   error_class, error_message, '{}'
            FROM workers_job WHERE id % 4 = 0 AND state <> 'queued'
            """
        )
        cursor.execute("ANALYZE workers_job; ANALYZE workers_attempt")
    yield
    # The test's rollback removes the rows but not what they took from the id sequences
    # (sequences are not transactional): give those back, so ids stay short for later tests.
    with connection.cursor() as cursor:
        for sequence, value in sequences.items():
            cursor.execute("SELECT setval(%s, %s, %s)", [sequence, max(value, 1), value > 0])


def timed(client: Client, url: str) -> tuple[int, float]:
    start = time.monotonic()
    response = client.get(url)
    return response.status_code, time.monotonic() - start


def test_pages_on_100k_jobs_use_a_constant_number_of_queries(
    many_jobs: None, clients: dict[str, Client], django_assert_max_num_queries: Any
) -> None:
    client = clients["operator"]
    client.get("/admin/console/")  # warm caches (content types, session) outside the counts
    # Session, user, permissions, the banner's pauses, the count, the page, the audit row (in its
    # transaction): 10 for any page of any filter, so nothing is queried per row.
    pages = {
        "/admin/console/jobs/": 10,
        "/admin/console/jobs/?page=1500": 10,
        "/admin/console/jobs/?state=failed": 10,
        "/admin/console/jobs/?kind=email.send&queue=critical&state=succeeded": 10,
        "/admin/console/jobs/?state=queued&page=3": 10,
        "/admin/console/": 18,  # one of them the live pauses, for the queue rows that say "paused"
        "/admin/console/failures/?window=7d": 12,
    }
    timings = {}
    for url, budget in pages.items():
        with django_assert_max_num_queries(budget):
            status, seconds = timed(client, url)
        assert status == 200, url
        timings[url] = seconds
    listing = client.get("/admin/console/jobs/?state=failed").content.decode()
    assert listing.count('<tr data-job="') == 50  # a page, never the whole set
    # Generous bounds (a shared 2-core machine): a sequential scan per row would take minutes.
    assert max(timings.values()) < 10, timings


def test_job_detail_queries_do_not_grow_with_attempts(
    many_jobs: None, clients: dict[str, Client], django_assert_max_num_queries: Any
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM workers_job WHERE state = 'failed' AND id % 4 = 0 ORDER BY id LIMIT 1")
        (job_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO workers_attempt (job_id, number, worker_id, lease_token, started_at, finished_at, outcome, "
            "error_class, error_message, usage) SELECT %s, n, 'w2', n, now(), now(), 'retry', 'X', 'again', '{}' "
            "FROM generate_series(2, 40) AS n",
            [job_id],
        )
    client = clients["auditor"]
    client.get("/admin/console/")
    with django_assert_max_num_queries(13):
        response = client.get(f"/admin/console/jobs/{job_id}/")
    assert response.status_code == 200
    assert response.content.decode().count('<tr data-outcome="') == 40  # its first attempt and 39 more
