"""Scenario 9.6: after a Redis outage, workers resume within 3 s and show again in RQ's registry.

A private redis-server without persistence (tests/acceptance/conftest.py) is stopped and
started again on the same port, empty, as a crash or a failover leaves it. Nothing is lost
either way (PostgreSQL holds the jobs and koala_beat re-rings); what is measured here is
how soon idle workers listen again, and whether django-rq's pages (rq.Worker.all) still
see the live workers.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from django.utils import timezone
from rq import Worker as RQWorker

from tests.conftest import wait_for
from tests.support.fleet import attempts, rq_workers, wait_exit, wait_start, wait_workers_ready
from workers import doorbell
from workers.services.jobs import enqueue

# transaction=True: real worker and beat subprocesses read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RESUME_BOUND_SECONDS = 3.0


def _start_pair(processes):  # type: ignore[no-untyped-def]
    simple = processes.worker("--name", "outage-simple")
    fork = processes.worker("--name", "outage-fork", "--worker-class", "fork", "--queues", "bulk")
    wait_workers_ready([simple, fork])
    return simple, fork


def test_idle_workers_resume_within_3s_of_redis_returning(private_redis, processes, tmp_path: Path, stray_pids) -> None:  # type: ignore[no-untyped-def]
    simple, fork = _start_pair(processes)
    private_redis.kill()
    time.sleep(10)  # the outage: long enough for RQ's own reconnect backoff to reach 8 s
    private_redis.start()  # same port, empty
    back_at = timezone.now()
    doorbell.reset_connection()
    log = str(tmp_path / "effects.log")
    # No beat runs: enqueue's own doorbell is the only message, so the job starts when a worker listens.
    first = enqueue(kind="probe", input={"log": log}).job_id
    second = enqueue(kind="probe", input={"log": log}, queue="bulk").job_id
    for job_id in (first, second):
        wait_start(log, job_id, timeout=30)
    waited = {job_id: (attempts(job_id)[0].started_at - back_at).total_seconds() for job_id in (first, second)}
    print(f"job start after Redis came back: simple {waited[first]:.2f}s, fork {waited[second]:.2f}s")
    assert all(w <= RESUME_BOUND_SECONDS for w in waited.values()), waited
    assert simple.poll() is None and fork.poll() is None


def test_live_workers_reregister_after_a_redis_restart_and_a_flushall(private_redis, processes, stray_pids) -> None:  # type: ignore[no-untyped-def]
    simple, fork = _start_pair(processes)
    names = {"outage-simple": "default", "outage-fork": "bulk"}

    def listed() -> bool:
        # What django-rq's worker pages read: the workers set, per queue, and each worker's hash.
        known = rq_workers()
        by_queue = {q: {w.name for w in RQWorker.all(queue=doorbell.rq_queue(q))} for q in set(names.values())}
        return all(n in known and known[n].queue_names() == [q] and n in by_queue[q] for n, q in names.items())

    for outage in ("restart", "flushall"):
        if outage == "restart":
            private_redis.kill()
            private_redis.start()  # same port, empty: the registry is gone
            doorbell.reset_connection()
        else:
            doorbell.redis_connection().flushall()  # connections stay open: nothing breaks to notice
        began = time.monotonic()
        wait_for(listed, timeout=10, interval=0.1, what=f"the live workers in RQ's registry after a {outage}")
        print(f"re-registered {time.monotonic() - began:.2f}s after a {outage}")
    # Re-registering never resurrects a worker that stopped.
    simple.send_signal(signal.SIGTERM)
    assert wait_exit(simple, timeout=15) == 0
    assert "outage-simple" not in rq_workers() and "outage-fork" in rq_workers()
    assert fork.poll() is None
