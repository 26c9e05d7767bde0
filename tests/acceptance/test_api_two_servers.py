"""Two API server processes sharing one database, as `uvicorn --workers 2` or two hosts run them.

What one server learns (a worker registering again with other kinds or another concurrency, a
stop) must hold in the other at once: the database is the truth, not either process's memory.
And a worker's concurrency holds across both: acquires racing through the two servers for one
worker never hold more leases than it declared (the limit is in the claim, under a lock on the
worker's row, not a count read before it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.api_server import ApiServer, ProtocolWorker
from workers.models import Job, JobState
from workers.services import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # live servers read the rows


@pytest.fixture
def two_servers(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[tuple[ApiServer, ApiServer]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Redis is not how one server learns of the other's registrations: a second Redis database
    # nobody writes to would do. Each server still gets the shared one (the doorbell rings jobs).
    servers = (ApiServer(tmp_path / "a"), ApiServer(tmp_path / "b"))
    for server in servers:
        server.start()
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def acquire(server: ApiServer, worker: ProtocolWorker, count: int = 1, wait: float = 0) -> tuple[int, Any]:
    return server.post(f"/api/v1/workers/{worker.worker_id}/acquire", {"max": count, "wait_seconds": wait}, key=worker.key)


def test_a_registration_changed_through_one_server_holds_in_the_other_at_once(
    two_servers: tuple[ApiServer, ApiServer], worker_key: str
) -> None:
    a, b = two_servers
    worker = ProtocolWorker(a, worker_key, kinds=["http.probe@1", "http.once@1"], name="both", concurrency=4)
    assert acquire(a, worker) == (204, None)  # server a has read the registration
    # Registered again through server b: http.once only, concurrency 1.
    ProtocolWorker(b, worker_key, kinds=["http.once@1"], name="both", concurrency=1)
    probe = jobs.enqueue(kind="http.probe", version=1, input={}).job_id
    status, body = acquire(a, worker)
    assert status == 204, f"server a handed out a kind the worker no longer serves: {body}"
    assert Job.objects.get(pk=probe).state == JobState.QUEUED
    for n in range(2):
        jobs.enqueue(kind="http.once", version=1, input={"n": n})
    status, body = acquire(a, worker)
    assert status == 200 and len(body["leases"]) == 1
    # Concurrency 1 now, as server b stored it: a second lease is refused by server a too.
    status, body = acquire(a, worker)
    assert status == 429 and body["error"] == "concurrency_exceeded", body
    assert Job.objects.filter(state=JobState.RUNNING, lease_holder="both").count() == 1


def test_a_stop_through_one_server_holds_in_the_other_without_redis(
    two_servers: tuple[ApiServer, ApiServer], worker_key: str
) -> None:
    from workers import doorbell

    a, b = two_servers
    first = jobs.enqueue(kind="http.probe", version=1, input={"n": 1}).job_id
    worker = ProtocolWorker(a, worker_key, kinds=["http.probe@1"], name="stopping", concurrency=4)
    status, body = acquire(a, worker)
    assert status == 200 and body["leases"][0]["job_id"] == first
    # The stop goes through server b while the announcement cannot reach server a: its Redis
    # subscription is cut (as by a partition between a and Redis) before the stop.
    client = doorbell.redis_connection()
    for entry in client.client_list():
        if "subscribe" in entry.get("cmd", "") or int(entry.get("sub", 0)) or int(entry.get("psub", 0)):
            client.client_kill_filter(_id=entry["id"])
    status, body = b.post(f"/api/v1/workers/{worker.worker_id}/stop", {"reason": "tests"}, key=worker_key)
    assert (status, body["held"], body["exited"]) == (200, 1, False)
    second = jobs.enqueue(kind="http.probe", version=1, input={"n": 2}).job_id
    status, body = acquire(a, worker)
    assert status == 204, f"server a handed a stopping worker a lease: {body}"
    assert Job.objects.get(pk=second).state == JobState.QUEUED


ROUNDS = 15
RACERS = 8
CONCURRENCY = 2


def test_acquires_racing_through_two_servers_never_exceed_the_workers_concurrency(
    two_servers: tuple[ApiServer, ApiServer], worker_key: str
) -> None:
    a, b = two_servers
    worker = ProtocolWorker(a, worker_key, kinds=["http.probe@1"], name="racer", concurrency=CONCURRENCY)
    for n in range(ROUNDS * RACERS * CONCURRENCY):
        jobs.enqueue(kind="http.probe", version=1, input={"n": n})
    worst = 0
    for _ in range(ROUNDS):
        gate = threading.Barrier(RACERS)
        got: list[dict[str, Any]] = []
        statuses: list[int] = []

        def race(server: ApiServer) -> None:
            gate.wait()
            status, body = acquire(server, worker, count=CONCURRENCY)
            statuses.append(status)
            if status == 200:
                got.extend(body["leases"])

        threads = [threading.Thread(target=race, args=(a if i % 2 else b,)) for i in range(RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        held = Job.objects.filter(state=JobState.RUNNING, lease_holder="racer").count()
        worst = max(worst, held, len(got))
        assert set(statuses) <= {200, 204, 429}, statuses
        assert held <= CONCURRENCY and len(got) <= CONCURRENCY, (held, len(got), statuses)
        for lease in got:  # end them all before the next round
            status, _ = worker.lease_call(lease, "complete", output={})
            assert status == 200
    assert worst == CONCURRENCY  # the worker did reach its concurrency: the limit was exercised
