"""Fixtures shared by every tier (the integration and acceptance tiers use real PostgreSQL and Redis)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

import tests.flows_kinds
import tests.kinds  # noqa: F401  (registers the test-only kinds in this process)
from tests.dburl import database_url
from tests.parallel import RUN_REDIS_URL, TURNS, longest_first, turn, worker_redis_urls
from workers import doorbell

# The slow and services markers, enforced (its hooks apply to every test of the session).
pytest_plugins = ["tests.support.markers"]

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_REDIS_DBS = "KOALA_EMBEDDED_REDIS_DBS"  # how many Redis databases devtools.embedded reserved


# -- running in parallel (tests/parallel.py) ---------------------------------------------------
@pytest.hookimpl(trylast=True)  # after pytest-django's own sort, which this one keeps
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    longest_first(items)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown under -p no:xdist
def pytest_xdist_setupnodes(config: pytest.Config, specs: list[Any]) -> None:
    """In the xdist controller, before any worker starts: each worker's own Redis database, in its
    environment, so the worker's Django settings (imported before any conftest) read it."""
    if os.environ.get("REDIS_URL_FILE"):
        raise pytest.UsageError("under pytest-xdist each worker gets its own REDIS_URL: set REDIS_URL, not REDIS_URL_FILE")
    reserved = os.environ.get(EMBEDDED_REDIS_DBS)
    try:
        urls = worker_redis_urls(settings.REDIS_URL, workers=len(specs), reserved=int(reserved) if reserved else None)
    except ValueError as exc:
        raise pytest.UsageError(f"cannot give each xdist worker its own Redis database: {exc}") from None
    turns = tempfile.mkdtemp(prefix="koala-test-turns-")  # removed when the run ends (pytest_unconfigure)
    config.stash[_TURNS_FOLDER] = turns
    for spec, url in zip(specs, urls, strict=True):
        spec.env |= {"REDIS_URL": url, RUN_REDIS_URL: settings.REDIS_URL, TURNS: turns}


_TURNS_FOLDER = pytest.StashKey[str]()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _TURNS_FOLDER in config.stash:
        shutil.rmtree(config.stash[_TURNS_FOLDER], ignore_errors=True)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout's: waiting for a turn is not the test's time
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    with turn(os.environ.get(TURNS), alone=item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.fixture
def redis_clean() -> Iterator[None]:
    """An empty Redis database (the one REDIS_URL names) before and after the test."""
    doorbell.reset_connection()
    doorbell.redis_connection().flushdb()
    yield
    doorbell.redis_connection().flushdb()


# Set by subprocess_database(): the URL (and settings) subprocesses use instead of the direct one.
_subprocess_database: dict[str, str] = {}


def database_url_for_subprocess() -> str:
    """A URL for the test database, for worker subprocesses (built from the live connection, unless
    subprocess_database() points them elsewhere: PgBouncer, tests/support/pgbouncer.py)."""
    return _subprocess_database.get("DATABASE_URL") or database_url(connection.settings_dict)


@contextlib.contextmanager
def subprocess_database(url: str, **settings_: str) -> Iterator[None]:
    """Within: subprocesses (worker_env, database_url_for_subprocess) reach the test database at
    ``url`` with ``settings_`` (e.g. KOALA_DATABASE_POOLING) in their environment."""
    saved = dict(_subprocess_database)
    _subprocess_database.clear()
    _subprocess_database.update(DATABASE_URL=url, **settings_)
    try:
        yield
    finally:
        _subprocess_database.clear()
        _subprocess_database.update(saved)


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url_for_subprocess(),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": os.environ.get("SECRET_KEY") or "test-secret-key-" + "x" * 48,
            "KOALA_JOB_KIND_MODULES": "workers.builtin_kinds,tests.kinds,tests.flows_kinds",
            "KOALA_LEASE_SECONDS": "3",
            "KOALA_HEARTBEAT_SECONDS": "0.5",
            "KOALA_ORPHAN_GRACE_SECONDS": "0.5",
            "KOALA_SHUTDOWN_DEADLINE_SECONDS": "3",
            "KOALA_BEAT_INTERVAL_SECONDS": "0.2",
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
        }
    )
    env.update(_subprocess_database)
    env.update(extra)
    return env


class Processes:
    """Real worker/beat subprocesses, always cleaned up (even when a test fails)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: dict[str, str] | None = None, name: str = "proc") -> subprocess.Popen[bytes]:
        log = open(self.tmp_path / f"{name}-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "manage.py"), *args],
            cwd=REPO,
            env=env or worker_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def worker(self, *extra: str, env: dict[str, str] | None = None, name: str = "worker") -> subprocess.Popen[bytes]:
        return self.start("koala_worker", "--queues", "default", *extra, env=env, name=name)

    def beat(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.start("koala_beat", env=env, name="beat")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.tmp_path.glob("*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def processes(tmp_path: Path, redis_clean: None) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def wait_for(
    predicate: Callable[[], object], *, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- fixtures every tier sees ------------------------------------------------------------------
# Imported here (pytest collects fixtures a conftest imports), after worker_env and the rest,
# which these modules import back from this one. A module's own fixture of the same name wins
# (tests/browser/test_console_browser.py's "people", tests/integration/test_command_input.py's
# "export_root").
from tests.support.api_server import api_server, execute_key, worker_key  # noqa: E402, F401
from tests.support.console import clients, reviewers, role_users  # noqa: E402, F401
from tests.support.effects import provider, smtp_sink  # noqa: E402, F401
from tests.support.exports import export_env, export_root, faults, people  # noqa: E402, F401
from tests.support.sdk import SDK_SRC  # noqa: E402, F401  (puts sdk/python/src on sys.path: koala_worker)
