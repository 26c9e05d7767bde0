"""/healthz and /readyz through a real uvicorn serving koala.asgi, as `make run` and production do."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.api_server import ApiServer
from tests.support.fleet import free_port

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_probes_through_the_served_asgi_application(api_server: ApiServer) -> None:
    status, body, headers = api_server.call("GET", "/healthz", headers={"Host": "localhost"})
    assert (status, body) == (200, "ok\n")
    assert headers["content-type"].startswith("text/plain")
    status, body, _ = api_server.call("GET", "/readyz", headers={"Host": "localhost"})
    assert (status, body) == (200, "database ok\nredis ok\nmigrations ok\n")


def test_readyz_is_503_when_the_served_process_cannot_reach_redis(tmp_path: Path, redis_clean: None) -> None:
    server = ApiServer(tmp_path, env={"REDIS_URL": f"redis://127.0.0.1:{free_port()}/4"})
    server.start()
    try:
        assert server.call("GET", "/healthz", headers={"Host": "localhost"})[:2] == (200, "ok\n")
        status, body, _ = server.call("GET", "/readyz", headers={"Host": "localhost"})
    finally:
        server.stop()
    assert (status, body) == (503, "database ok\nredis failed\nmigrations ok\n")


def test_readyz_is_503_when_the_served_process_cannot_reach_postgresql(tmp_path: Path, redis_clean: None) -> None:
    server = ApiServer(tmp_path, env={"DATABASE_URL": f"postgres://root@127.0.0.1:{free_port()}/koala"})
    server.start()
    try:
        assert server.call("GET", "/healthz", headers={"Host": "localhost"})[:2] == (200, "ok\n")
        status, body, _ = server.call("GET", "/readyz", headers={"Host": "localhost"})
    finally:
        server.stop()
    assert (status, body) == (503, "database failed\nredis ok\nmigrations unknown\n")
