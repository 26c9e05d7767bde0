"""What one API server process holds at once is bounded, and the excess is answered at once with
503 ``busy`` and Retry-After: waiting acquires (KOALA_API_MAX_WAITING) and calls waiting for one of
its database threads (KOALA_API_MAX_QUEUED_CALLS beyond KOALA_API_DB_THREADS). Without the bounds
a flood of workers (or one misbehaving SDK) queued without limit: memory, latency, and every
caller timing out and trying again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from tests.support.api_server import ApiServer, ProtocolWorker
from workers.models import WorkerProcess
from workers.services import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # a live server reads the rows


def served(tmp_path: Path, env: dict[str, str]) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path, env=env)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def two_waiters_server(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[ApiServer]:
    yield from served(tmp_path, {"KOALA_API_MAX_WAITING": "2"})


@pytest.fixture
def one_thread_server(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[ApiServer]:
    # Long lock and statement bounds: the test holds a row lock the server's one thread waits on.
    yield from served(
        tmp_path,
        {
            "KOALA_API_DB_THREADS": "1",
            "KOALA_API_MAX_QUEUED_CALLS": "1",
            "KOALA_LEASE_SECONDS": "60",
            "KOALA_DB_LOCK_TIMEOUT_SECONDS": "15",
            "KOALA_DB_STATEMENT_TIMEOUT_SECONDS": "20",
            "KOALA_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS": "20",
        },
    )


def acquire(worker: ProtocolWorker, wait: float) -> tuple[int, Any, dict[str, str]]:
    return worker.server.call(
        "POST", f"/api/v1/workers/{worker.worker_id}/acquire", {"max": 1, "wait_seconds": wait}, key=worker.key, timeout=60
    )


def test_waiting_acquires_beyond_the_bound_are_answered_busy_at_once(two_waiters_server: ApiServer, worker_key: str) -> None:
    workers = [ProtocolWorker(two_waiters_server, worker_key, kinds=["http.probe@1"], name=f"w{n}") for n in range(3)]
    answers: list[int] = []
    waiting = [threading.Thread(target=lambda w=w: answers.append(acquire(w, 8)[0])) for w in workers[:2]]
    for thread in waiting:
        thread.start()
    time.sleep(1.0)  # the two long-polls must be waiting in the server before the third arrives
    began = time.monotonic()
    status, body, headers = acquire(workers[2], 8)
    assert (status, body["error"]) == (503, "busy"), body
    assert int(headers["retry-after"]) >= 1 and time.monotonic() - began < 3
    # Work arriving is still handed to the waiting ones; once they are answered there is room again.
    jobs.enqueue(kind="http.probe", version=1, input={})
    for thread in waiting:
        thread.join(timeout=20)
    assert sorted(answers) == [200, 204]
    assert acquire(workers[2], 0.5)[0] == 204


def test_calls_beyond_the_database_threads_and_their_queue_are_answered_busy(
    one_thread_server: ApiServer, worker_key: str
) -> None:
    worker = ProtocolWorker(one_thread_server, worker_key, kinds=["http.probe@1"], name="blocked")
    jobs.enqueue(kind="http.probe", version=1, input={})
    answers: list[int] = []
    with transaction.atomic():
        # Hold the worker's row: the server's claim for it waits on the lock, in its only thread.
        WorkerProcess.objects.select_for_update().get(name="blocked")
        first = threading.Thread(target=lambda: answers.append(acquire(worker, 0)[0]))
        first.start()
        time.sleep(1.0)  # the first claim must hold the thread before the second call queues
        second = threading.Thread(target=lambda: answers.append(acquire(worker, 0)[0]))
        second.start()
        time.sleep(1.0)  # and the second must be queued before the third arrives
        status, body, headers = acquire(worker, 0)
        assert (status, body["error"]) == (503, "busy"), body
        assert int(headers["retry-after"]) >= 1
        assert first.is_alive() and second.is_alive()
    first.join(timeout=20)
    second.join(timeout=20)
    # Once the lock is gone both are served: one gets the one job, the other finds none left.
    assert sorted(answers) == [200, 204], answers
