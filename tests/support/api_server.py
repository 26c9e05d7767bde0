"""The worker API as users run it: a real uvicorn process serving koala.asgi on a free port,
against the test database, and a small JSON client for the calls (no SDK: the protocol alone).

    def test_x(api_server, worker_key):
        status, body = api_server.post("/api/v1/workers/register", {...}, key=worker_key)
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.servers import uvicorn_command, wait_listening
from tests.conftest import REPO, worker_env
from tests.support.fleet import free_port

API_ENV = {
    # Short enough for fault tests to reclaim quickly; the heartbeat interval a lease carries.
    "KOALA_LEASE_SECONDS": "3",
    "KOALA_HEARTBEAT_SECONDS": "0.5",
    "KOALA_API_ACQUIRE_WAIT_SECONDS": "10",
}


class ApiServer:
    """One uvicorn process; ``restart`` keeps the port (workers reconnect to the same URL)."""

    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.tmp_path = tmp_path
        self.env = worker_env(**{**API_ENV, **(env or {})})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        log = open(self.tmp_path / f"api-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(
            uvicorn_command(host="127.0.0.1", port=self.port, access_log=False, graceful_seconds=2),
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if not wait_listening(self.proc, self.port, timeout=30):
            raise AssertionError(f"uvicorn did not start on {self.port}:\n{self.log()}")

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.tmp_path.glob("api-*.log")))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    # -- a JSON client (http.client: what any language's plain HTTP looks like) -------------------
    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, Any, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        sent = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        try:
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            data = response.read()
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()
        parsed: Any = None
        if data:
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = data.decode(errors="replace")
        return response.status, parsed, answer_headers

    def post(self, path: str, body: Any = None, **options: Any) -> tuple[int, Any]:
        status, parsed, _ = self.call("POST", path, body, **options)
        return status, parsed


@pytest.fixture
def api_server(tmp_path: Path, redis_clean: None, transactional_db: None) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def make_key(*scopes: str, name: str = "test key", person: str = "") -> str:
    from api import keys

    _, raw = keys.create_key(name=name, scopes=list(scopes) or ["worker"], actor="tests", person=person)
    return raw


@pytest.fixture
def worker_key(transactional_db: None) -> str:
    return make_key("worker", name="worker key")


@pytest.fixture
def execute_key(transactional_db: None) -> str:
    return make_key("execute", name="execute key")


class ProtocolWorker:
    """A worker written against the protocol alone: register, acquire, heartbeat, report."""

    def __init__(self, server: ApiServer, key: str, *, kinds: list[Any], name: str = "w1", concurrency: int = 4) -> None:
        self.server, self.key = server, key
        status, body = server.post(
            "/api/v1/workers/register", {"name": name, "kinds": kinds, "concurrency": concurrency}, key=key
        )
        assert status == 200, body
        self.worker_id = body["worker_id"]

    def acquire(self, count: int = 1, wait: float = 5.0) -> list[dict[str, Any]]:
        status, body = self.server.post(
            f"/api/v1/workers/{self.worker_id}/acquire", {"max": count, "wait_seconds": wait}, key=self.key
        )
        assert status in (200, 204), (status, body)
        return body["leases"] if status == 200 else []

    def lease_call(self, lease: dict[str, Any], what: str, **fields: Any) -> tuple[int, Any]:
        body = {"worker_id": self.worker_id, "lease_token": lease["lease_token"], **fields}
        return self.server.post(f"/api/v1/leases/{lease['lease_id']}/{what}", body, key=self.key)
