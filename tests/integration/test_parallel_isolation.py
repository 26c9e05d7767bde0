"""Under pytest-xdist each worker has a test database and a Redis database of its own
(tests/parallel.py), and what the tests read server-wide is narrowed to them. Serially the same
assertions hold for the one "worker" (index 0), so nothing here is skipped either way."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from redis import Redis

from tests.conftest import wait_for
from tests.parallel import RUN_REDIS_URL, redis_db, with_db
from tests.support.exports import database_backends
from tests.support.fleet import listening
from workers import doorbell

# services: the second connection is opened from the connection settings (a unix socket or TCP).
pytestmark = [pytest.mark.services, pytest.mark.django_db]

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
INDEX = int(WORKER.removeprefix("gw")) if WORKER else 0


def test_each_worker_has_its_own_test_database_and_redis_database() -> None:
    name = connection.settings_dict["NAME"]
    assert name.endswith(f"_{WORKER}") if WORKER else not name.endswith("_gw0"), name
    # The run's REDIS_URL (the controller's) names the first worker's database; serially, this one's.
    run_url = os.environ.get(RUN_REDIS_URL, settings.REDIS_URL)
    assert settings.REDIS_URL == with_db(run_url, redis_db(run_url) + INDEX)
    assert os.environ["REDIS_URL"] == settings.REDIS_URL  # what subprocesses inherit (worker_env, demo_env)
    assert doorbell.channel("doorbell") == f"koala:{redis_db(run_url) + INDEX}:doorbell"


@pytest.fixture
def other_database_backend() -> Iterator[int]:
    """A session on another database of the same server named like this database's export stream."""
    params = connection.settings_dict
    with psycopg.connect(
        dbname="postgres",
        host=params.get("HOST") or None,
        port=params.get("PORT") or None,
        user=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        application_name="koala-export-1",
        autocommit=True,
    ) as other:
        yield other.info.backend_pid


def test_backends_by_application_name_are_this_databases_only(other_database_backend: int) -> None:
    # Another worker's export 1 streams under the same application_name in its own database; the
    # dropped-connection test must never terminate that one.
    assert other_database_backend not in database_backends("koala-export-1")


def test_blocked_clients_are_counted_on_this_redis_database_only(redis_clean: None) -> None:
    # Another worker's koala_worker waits in its pop on that worker's database of the same server.
    other_db = (redis_db(settings.REDIS_URL) + 1) % 16
    other = Redis.from_url(with_db(settings.REDIS_URL, other_db), socket_timeout=10)
    before = listening()
    blocked = other.connection_pool.get_connection()
    try:
        blocked.send_command("BLPOP", "koala-test-nothing", 5)
        server = doorbell.redis_connection()
        wait_for(
            lambda: any(c.get("db") == str(other_db) and "b" in c.get("flags", "") for c in server.client_list()),
            timeout=5,
            what="a client blocked on the other database",
        )
        assert listening() == before
    finally:
        blocked.disconnect()
