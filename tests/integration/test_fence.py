"""The strict fence (leases.hold_lease) and the bounded worker sessions, against real PostgreSQL.

Two connections (threads) race the way a stale attempt and a reclaimer do; nothing of Koala's
is mocked. The partition versions of these races, with real worker processes and a TCP proxy,
are in tests/acceptance/test_partitions.py.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import close_old_connections, connection, connections, transaction

from tests.conftest import wait_for
from tests.integration.test_leases import expire_lease
from workers.dbsession import apply_bounds, session_bounds
from workers.errors import Rejection
from workers.models import Job
from workers.services import leases
from workers.services.jobs import enqueue
from workers.services.maintenance import reap

# transaction=True: two connections (threads) must see each other's committed rows and locks.
pytestmark = pytest.mark.django_db(transaction=True)


def _running_job() -> leases.Lease:
    job_id = enqueue(kind="noop", input={}).job_id
    lease = leases.claim_job(job_id=job_id, worker="w1", lease_seconds=30, gated=False)
    assert lease is not None
    return lease


def test_hold_lease_needs_a_transaction(redis_clean: None) -> None:
    lease = _running_job()
    with pytest.raises(RuntimeError, match=r"inside transaction\.atomic"):
        leases.hold_lease(job_id=lease.job_id, lease_token=lease.lease_token)


def test_hold_lease_names_why_a_lease_is_not_ours(redis_clean: None) -> None:
    lease = _running_job()
    with transaction.atomic():
        assert leases.hold_lease(job_id=lease.job_id, lease_token=lease.lease_token) is None
    with transaction.atomic():
        assert leases.hold_lease(job_id=lease.job_id, lease_token=lease.lease_token - 1) is Rejection.LEASE_SUPERSEDED
    expire_lease(lease.job_id)
    with transaction.atomic():
        assert leases.hold_lease(job_id=lease.job_id, lease_token=lease.lease_token) is Rejection.LEASE_EXPIRED


def test_an_expired_lease_held_by_a_stalled_transaction_is_reaped_once_it_ends(redis_clean: None) -> None:
    """The lease runs out while its holder sits idle in a transaction: nobody can take the job
    over, and the reaper skips the locked row at once instead of queueing behind it; once the
    holder's transaction ends (a worker session's idle bound ends it), the job is taken back."""
    lease = _running_job()
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_job SET lease_expires_at = now() + interval '300 ms' WHERE id = %s", [lease.job_id])
    holding, release = threading.Event(), threading.Event()

    def attempt() -> None:
        try:
            with transaction.atomic():
                assert leases.hold_lease(job_id=lease.job_id, lease_token=lease.lease_token) is None
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=attempt)
    thread.start()
    try:
        assert holding.wait(10)
        # The lease runs out while its holder keeps the row locked: that needs the 300 ms of wall
        # time set above, read off PostgreSQL's own clock (the reader is not blocked by the lock).
        wait_for(lambda: expired(lease.job_id), timeout=10, what="the held lease to expire")
        started = time.monotonic()
        report = reap(grace_seconds=0)
        assert time.monotonic() - started < 1.0  # skipped, not waited for
        assert (report.orphaned, report.requeued) == (0, 0)
    finally:
        release.set()
        thread.join(10)
    report = reap(grace_seconds=0)
    assert (report.orphaned, report.requeued) == (1, 1)
    assert Job.objects.get(pk=lease.job_id).state == "queued"


def expired(job_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_expires_at < now() FROM workers_job WHERE id = %s", [job_id])
        return bool(cursor.fetchone()[0])


def test_bounded_sessions_carry_every_bound(redis_clean: None) -> None:
    close_old_connections()
    conn = connections.create_connection("default")
    try:
        conn.ensure_connection()
        apply_bounds(conn)
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            )
            row = cursor.fetchone()
    finally:
        conn.close()
    bounds = session_bounds()

    def ms(text: str) -> int:
        return int(text.removesuffix("ms"))

    expected = (bounds["statement_timeout"], bounds["lock_timeout"], bounds["idle_in_transaction_session_timeout"])
    # PostgreSQL echoes a setting in its own unit (e.g. "10s" for 10000ms): compare as milliseconds.
    with connection.cursor() as cursor:
        got = []
        for value in row:
            cursor.execute("SELECT extract(epoch FROM %s::interval) * 1000", [value])
            got.append(int(cursor.fetchone()[0]))
    assert got == [ms(v) for v in expected]
