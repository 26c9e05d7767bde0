"""A worker key limited to kinds and queues, against a real uvicorn process: a registration
outside the limits is refused before anything is written, and no acquire hands a lease for a
job outside them — not after a refused re-registration, not for a registration the key's
limits no longer cover (the key row edited by hand: every process re-reads its keys every
KOALA_API_KEY_CACHE_SECONDS). Rows are the record."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.keys import create_key
from api.models import ApiKey
from tests.conftest import wait_for
from tests.support.api_server import ApiServer
from workers.models import Attempt, Job, JobState, WorkerProcess
from workers.services import jobs

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def server(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[ApiServer]:
    # Keys re-read at once: the test edits a key's limits by hand and watches the server notice.
    api = ApiServer(tmp_path, env={"KOALA_API_KEY_CACHE_SECONDS": "0"})
    api.start()
    try:
        yield api
    finally:
        api.stop()


def key(**limits: Any) -> str:
    return create_key(name="limited", scopes=["worker"], actor="tests", **limits)[1]


def register(server: ApiServer, raw: str, kinds: list[str], **extra: Any) -> tuple[int, Any]:
    return server.post("/api/v1/workers/register", {"name": "w-limited", "kinds": kinds, "concurrency": 4, **extra}, key=raw)


def acquire(server: ApiServer, raw: str, *, wait: float = 0) -> tuple[int, Any]:
    return server.post("/api/v1/workers/w-limited/acquire", {"max": 4, "wait_seconds": wait}, key=raw)


def enqueue(kind: str, queue: str | None = None) -> int:
    return jobs.enqueue(kind=kind, version=1, input={"secret": "s3cr3t-value"}, queue=queue).job_id


def test_a_limited_worker_key_registers_and_is_leased_only_within_its_limits(server: ApiServer) -> None:
    raw = key(kinds=["http.probe@1"], queues=["default"])
    for kinds, extra, field in [
        (["http.once@1"], {}, "kinds"),
        (["http.probe@1", "http.probe@2"], {}, "kinds"),
        (["http.probe@1"], {"queues": ["default", "critical"]}, "queues"),
    ]:
        status, body = register(server, raw, kinds, **extra)
        assert (status, body["error"]) == (403, "forbidden") and body["message"].startswith(f"{field}: "), body
    assert not WorkerProcess.objects.exists()

    status, body = register(server, raw, ["http.probe@1"])
    assert status == 200 and body["kinds"] == ["http.probe@1"] and body["queues"] == ["default"], body
    mine = enqueue("http.probe")
    others = [enqueue("http.once"), enqueue("http.probe", queue="critical")]
    # A restart asking for more is refused and changes nothing of the registration.
    assert register(server, raw, ["http.probe@1", "http.once@1"])[0] == 403
    assert WorkerProcess.objects.get(name="w-limited").kinds == ["http.probe@1"]

    status, body = acquire(server, raw, wait=5)
    assert status == 200 and [lease["job_id"] for lease in body["leases"]] == [mine], body
    status, _ = acquire(server, raw)
    assert status == 204  # nothing else this key may be leased, though two jobs wait
    assert list(Job.objects.filter(pk__in=others).values_list("state", flat=True)) == [JobState.QUEUED] * 2
    assert not Attempt.objects.filter(job_id__in=others).exists()


def test_a_registration_the_keys_limits_no_longer_cover_gets_no_lease(server: ApiServer) -> None:
    raw = key()
    status, body = register(server, raw, ["http.probe@1", "http.once@1"])
    assert status == 200, body
    # Limits set on the key after it registered (by hand: no service changes a key's limits).
    ApiKey.objects.update(kinds=["http.probe"])

    def refused() -> Any:
        status, body = acquire(server, raw)  # nothing is due yet: a 204 before the server notices
        return body if status == 403 else None

    body = wait_for(refused, timeout=10, what="the server to hold the registration to the key's new limits")
    assert body["message"].startswith("kinds: http.once@1 outside"), body
    job_id = enqueue("http.once")
    status, body = acquire(server, raw, wait=1)
    assert status == 403, body
    assert Job.objects.get(pk=job_id).state == JobState.QUEUED and not Attempt.objects.filter(job_id=job_id).exists()
