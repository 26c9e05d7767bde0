"""How tests share the machine under pytest-xdist (tests/parallel.py). Each worker's own Redis
database: the URL keeps its scheme, host and options and names REDIS_URL's database plus the
worker's index; more workers than Redis has databases are refused before any worker starts.
Turns: an ``alone`` test runs with no other test beside it."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

import pytest
from redis.connection import parse_url

from tests.conftest import wait_for
from tests.parallel import REDIS_DATABASES, TooManyWorkers, turn, worker_redis_urls


def test_each_worker_gets_the_next_database_of_the_same_server() -> None:
    urls = worker_redis_urls("redis://127.0.0.1:6391/0", workers=3)
    assert urls == ["redis://127.0.0.1:6391/0", "redis://127.0.0.1:6391/1", "redis://127.0.0.1:6391/2"]


def test_the_count_starts_at_the_urls_own_database() -> None:
    urls = worker_redis_urls("redis://:secret@cache.internal:6380/4?socket_timeout=5", workers=2)
    assert [parse_url(url)["db"] for url in urls] == [4, 5]
    for url in urls:
        parts = parse_url(url)
        assert (parts["host"], parts["port"], parts["password"], parts["socket_timeout"]) == (
            "cache.internal",
            6380,
            "secret",
            5.0,
        )


def test_a_url_without_a_database_starts_at_zero() -> None:
    assert worker_redis_urls("rediss://127.0.0.1:6390", workers=2) == ["rediss://127.0.0.1:6390/0", "rediss://127.0.0.1:6390/1"]


def test_a_database_in_the_query_is_replaced_where_it_stands() -> None:
    # redis-py reads ?db= before the path; the embedded Redis (devtools.embedded) is a unix socket with ?db=N.
    urls = worker_redis_urls("unix:///tmp/koala-0-3f2a/redis.sock?db=3", workers=2)
    assert urls == ["unix:///tmp/koala-0-3f2a/redis.sock?db=3", "unix:///tmp/koala-0-3f2a/redis.sock?db=4"]
    assert [parse_url(url)["path"] for url in urls] == ["/tmp/koala-0-3f2a/redis.sock"] * 2
    assert worker_redis_urls("redis://h:1/9?db=2&health_check_interval=3", workers=1) == [
        "redis://h:1/9?db=2&health_check_interval=3"
    ]


def test_a_unix_socket_without_a_database_gets_one_in_the_query() -> None:
    urls = worker_redis_urls("unix:///run/redis.sock", workers=2)
    assert urls == ["unix:///run/redis.sock?db=0", "unix:///run/redis.sock?db=1"]
    assert [(parse_url(url)["path"], parse_url(url)["db"]) for url in urls] == [("/run/redis.sock", 0), ("/run/redis.sock", 1)]


def test_all_sixteen_databases_can_be_used_and_not_one_more() -> None:
    assert REDIS_DATABASES == 16
    assert len(worker_redis_urls("redis://127.0.0.1:6379/0", workers=16)) == 16
    with pytest.raises(TooManyWorkers, match=r"17 workers need Redis databases 0-16 .* Redis has 16 \(0-15\)"):
        worker_redis_urls("redis://127.0.0.1:6379/0", workers=17)
    with pytest.raises(TooManyWorkers, match=r"at most 6 workers"):
        worker_redis_urls("redis://127.0.0.1:6379/10", workers=7)


def test_a_launcher_reservation_bounds_the_workers() -> None:
    # devtools.embedded reserved 4 databases for this run (KOALA_EMBEDDED_REDIS_DBS): a fifth worker would
    # share a database with another launcher (make run) on the same embedded Redis.
    assert len(worker_redis_urls("unix:///s/redis.sock?db=2", workers=4, reserved=4)) == 4
    with pytest.raises(TooManyWorkers, match=r"reserved 4 Redis databases .* TEST_WORKERS=5"):
        worker_redis_urls("unix:///s/redis.sock?db=2", workers=5, reserved=4)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/x", "redis://127.0.0.1:6379/0?db=-1", "memcache://127.0.0.1"])
def test_a_url_that_names_no_usable_database_is_refused(url: str) -> None:
    with pytest.raises(ValueError):
        worker_redis_urls(url, workers=2)


def _held(path: Path, mode: int) -> bool:
    """Whether someone holds a lock on ``path`` that conflicts with ``mode`` (probed, never waited for)."""
    with open(path, "a") as probe:
        try:
            fcntl.flock(probe, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(probe, fcntl.LOCK_UN)
        return False


def test_an_alone_test_waits_for_the_running_ones_and_keeps_newcomers_out(tmp_path: Path) -> None:
    # Threads stand in for xdist workers: each open() is its own lock holder for flock.
    log: list[str] = []
    release_first = threading.Event()

    def run(name: str, *, alone: bool, hold: threading.Event | None = None) -> None:
        with turn(str(tmp_path), alone=alone):
            log.append(f"{name} in")
            if hold is not None:
                hold.wait(10)
            log.append(f"{name} out")

    first = threading.Thread(target=run, args=("first",), kwargs={"alone": False, "hold": release_first})
    first.start()
    wait_for(lambda: log == ["first in"], what="the first test to run")
    lonely = threading.Thread(target=run, args=("alone",), kwargs={"alone": True})
    lonely.start()
    wait_for(lambda: _held(tmp_path / "gate", fcntl.LOCK_SH), what="the alone test to close the gate")
    newcomer = threading.Thread(target=run, args=("newcomer",), kwargs={"alone": False})
    newcomer.start()
    assert log == ["first in"]  # the alone test waits for the first; the newcomer waits at the gate
    release_first.set()
    for thread in (first, lonely, newcomer):
        thread.join(10)
    assert log == ["first in", "first out", "alone in", "alone out", "newcomer in", "newcomer out"]


def test_tests_that_are_not_alone_run_side_by_side(tmp_path: Path) -> None:
    with turn(str(tmp_path), alone=False), turn(str(tmp_path), alone=False):
        assert _held(tmp_path / "running", fcntl.LOCK_EX) and not _held(tmp_path / "running", fcntl.LOCK_SH)
    assert not _held(tmp_path / "running", fcntl.LOCK_EX) and not _held(tmp_path / "gate", fcntl.LOCK_EX)
    with turn(None, alone=True):  # serially there is no folder and nobody to wait for
        pass
