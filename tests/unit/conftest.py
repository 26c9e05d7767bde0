"""The unit tier: pure code, no services. ``pytest tests/unit`` runs with PostgreSQL and Redis down.

Three guards, loud on purpose (a unit test that quietly needs a database is an integration
test in the wrong folder, and one that swallowed the refusal would pass for the wrong reason):

- collection stops if a test here carries ``django_db``;
- any attempt to connect to the database fails the test, even if the code under test caught
  the error (pytest-django already refuses unmarked tests; this also sees a swallowed refusal);
- any socket connection (Redis, HTTP, PostgreSQL over TCP or a unix socket) fails the test the same way.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper

UNIT = Path(__file__).resolve().parent


def _in_unit_tier(item: pytest.Item) -> bool:
    return UNIT in Path(str(item.path)).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item.nodeid for item in items if _in_unit_tier(item) and item.get_closest_marker("django_db")]
    if marked:
        raise pytest.UsageError(
            "unit tests never use the database; move these to tests/integration or drop django_db: " + ", ".join(marked)
        )


class ServiceTouched(AssertionError):
    """A unit test reached for the database or the network."""


@pytest.fixture(autouse=True)
def _no_services(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if not _in_unit_tier(request.node):
        yield
        return
    touched: list[str] = []
    # Threads an earlier (integration) test on this xdist worker left running, such as the API
    # hub's doorbell listener reconnecting to Redis, are not this test reaching for a service:
    # their connects go through. The test's own thread and any thread it starts are refused.
    inherited = {thread for thread in threading.enumerate() if thread is not threading.current_thread()}
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def refuse(what: str) -> ServiceTouched:
        touched.append(what)
        return ServiceTouched(f"unit tests use no services, but this one reached for {what}")

    ensure_connection = BaseDatabaseWrapper.ensure_connection

    def no_database(self: BaseDatabaseWrapper, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread() in inherited:
            return ensure_connection(self, *args, **kwargs)
        raise refuse(f"the database ({self.alias})")

    def no_network(self: socket.socket, address: Any) -> Any:
        if threading.current_thread() in inherited:
            return connect(self, address)
        raise refuse(f"a socket ({address!r})")  # TCP or a unix socket (the embedded PostgreSQL and Redis)

    def no_network_ex(self: socket.socket, address: Any) -> Any:
        if threading.current_thread() in inherited:
            return connect_ex(self, address)
        return no_network(self, address)

    monkeypatch.setattr(BaseDatabaseWrapper, "ensure_connection", no_database)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network_ex)
    yield
    if touched:
        pytest.fail("unit tests use no services, but this one reached for " + "; ".join(touched), pytrace=False)
