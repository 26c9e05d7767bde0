"""A partition between an API server process and PostgreSQL, mid-transaction, through a TCP proxy.

HTTP workers write through the API server, so the API server's sessions must be bounded exactly as
an RQ worker's are (workers/dbsession.py): a transaction whose server-side client went silent is
ended by PostgreSQL, its row locks released, so the replacement attempt (another server process,
another worker) is not blocked, and the stale side's late writes are refused. The same scenario as
tests/acceptance/test_partitions.py's first test, with the stale attempt an HTTP worker's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.test_partitions import PARTITION, _proxied_url, _upstream
from tests.conftest import wait_for
from tests.fakes.netproxy import FaultProxy
from tests.support.api_server import ApiServer, ProtocolWorker
from tests.support.fleet import attempts, job, wait_state
from workers.models import JobState, Operation, Outcome
from workers.services.jobs import enqueue

# transaction=True: the API servers and the beat read and write these rows on their own connections.
# services: the API server's PostgreSQL traffic goes through a TCP proxy built from the connection settings.
pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def pg_proxy() -> Iterator[FaultProxy]:
    proxy = FaultProxy(_upstream()).start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def two_servers(tmp_path: Path, redis_clean: None, pg_proxy: FaultProxy) -> Iterator[tuple[ApiServer, ApiServer]]:
    """One API server whose PostgreSQL traffic goes through the proxy, one connected directly."""
    (tmp_path / "stale").mkdir()
    (tmp_path / "healthy").mkdir()
    stale = ApiServer(tmp_path / "stale", env={"DATABASE_URL": _proxied_url(pg_proxy)})
    healthy = ApiServer(tmp_path / "healthy")
    stale.start()
    healthy.start()
    try:
        yield stale, healthy
    finally:
        stale.stop()
        healthy.stop()


def test_a_partitioned_api_server_never_blocks_the_replacement(
    two_servers: tuple[ApiServer, ApiServer], pg_proxy: FaultProxy, worker_key: str, processes: Any
) -> None:
    """Partitioned right after the in-flight INSERT of an operation reached PostgreSQL (the job row
    locked by the strict fence, the transaction open): PostgreSQL ends that transaction, the beat
    reclaims the job, another worker through another server sends and completes it while the
    partition lasts; the stale worker is never told to send, and its late calls change nothing."""
    stale_server, healthy_server = two_servers
    job_id = enqueue(kind="http.charge", input={"amount": 100}).job_id
    stale = ProtocolWorker(stale_server, worker_key, kinds=["http.charge@1"], name="stale-w")
    [lease] = stale.acquire()
    assert lease["job_id"] == job_id

    fired = pg_proxy.blackhole_after(b"INSERT INTO workers_operation")
    answers: list[tuple[int, Any]] = []
    operation = {"name": "charge", "kind": "charge", "params": {"amount_minor": 100}, "estimate_minor": 100}
    begin = threading.Thread(target=lambda: answers.append(stale.lease_call(lease, "operations", **operation)), daemon=True)
    begin.start()
    assert fired.wait(20), "the stale server never reached the ledger"

    processes.beat()  # the reaper, on a direct connection
    healthy = ProtocolWorker(healthy_server, worker_key, kinds=["http.charge@1"], name="healthy-w")
    got: list[dict[str, Any]] = []
    wait_for(lambda: got.extend(healthy.acquire(wait=1.0)) or got, timeout=PARTITION, what="the job to be reclaimed")
    [fresh] = got
    status, sent = healthy.lease_call(fresh, "operations", **operation)
    assert (status, sent["action"]) == (200, "send"), sent
    status, settled = healthy.server.post(
        f"/api/v1/leases/{fresh['lease_id']}/operations/{sent['operation_id']}",
        {"worker_id": healthy.worker_id, "lease_token": fresh["lease_token"], "outcome": "succeeded", "external_id": "ch_1"},
        key=worker_key,
    )
    assert (status, settled["action"]) == (200, "done"), settled
    status, _ = healthy.lease_call(fresh, "complete", output={"ok": True})
    assert status == 200
    wait_state(job_id, JobState.SUCCEEDED, timeout=5)
    assert pg_proxy.blackholed, "the replacement ran while the stale server was still cut off"

    pg_proxy.heal()
    begin.join(timeout=40)
    assert not begin.is_alive()
    [(status, answer)] = answers
    assert status != 200 or answer.get("action") != "send", "the stale worker was told to call the provider"
    for what in ("heartbeat", "complete"):
        status, answer = stale.lease_call(lease, what, **({"output": {"late": True}} if what == "complete" else {}))
        assert (status, answer["error"]) == (409, "lease_superseded"), (what, status, answer)
    done = job(job_id)
    assert done.state == JobState.SUCCEEDED and done.result == {"ok": True}
    assert [a.outcome for a in attempts(job_id)] == [Outcome.ORPHANED, Outcome.SUCCEEDED]
    [op] = Operation.objects.filter(job_id=job_id)
    assert (op.state, op.attempt_id, op.attempts) == ("succeeded", attempts(job_id)[1].pk, 1)
