"""Each pytest-xdist worker's own Redis database (tests/parallel.py): the URL keeps its scheme,
host and options and names REDIS_URL's database plus the worker's index; more workers than
Redis has databases are refused before any worker starts."""

from __future__ import annotations

import pytest
from redis.connection import parse_url

from tests.parallel import REDIS_DATABASES, TooManyWorkers, worker_redis_urls


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
