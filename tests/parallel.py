"""How the suite runs in parallel (pytest-xdist, ``make test``): what each worker gets of its own.

- **PostgreSQL**: pytest-django names each worker's test database ``test_<name>_gw<N>`` by itself;
  everything that hands the database to a subprocess builds the URL from the live connection
  (``tests/dburl.py``), so a worker's subprocesses use its database.
- **Redis**: worker ``gw<N>`` uses REDIS_URL's database number plus N, set in the worker's
  environment by the controller (``pytest_xdist_setupnodes`` in tests/conftest.py) before the
  worker imports Django's settings, so ``settings.REDIS_URL``, ``RQ_QUEUES``, ``worker_env()`` and
  the doorbell's pub/sub channels (``workers.doorbell.channel`` carries the number) all name it.
  Redis has 16 databases (0-15): REDIS_URL's number plus the worker count must stay within them.
  The run's own REDIS_URL stays in each worker's ``KOALA_TEST_RUN_REDIS_URL``.
  Under ``make test`` with the embedded services, devtools.embedded reserves one database per worker
  (``KOALA_EMBEDDED_REDIS_DBS``) so a ``make run`` beside it keeps its own.
- **The machine**: a test marked ``alone`` (it asserts a wall-clock bound) runs while no other test
  does (``turn``); the others wait for it, then go on.
- **The order**: slow tests first (``longest_first``), so the long ones do not end the run late.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from pytest_django.plugin import validate_django_db
from redis.connection import parse_url

REDIS_DATABASES = 16  # redis-server's default `databases`; the embedded Redis has the same
RUN_REDIS_URL = "KOALA_TEST_RUN_REDIS_URL"  # in each worker: the run's REDIS_URL (the controller's)


class TooManyWorkers(ValueError):
    """More workers than Redis databases are left for them."""


def redis_db(url: str) -> int:
    """The database number a Redis URL names, as redis-py reads it (``?db=`` before the path)."""
    parsed = parse_url(url)  # refuses other schemes and a malformed ?db=
    path = urlsplit(url).path.strip("/")
    if "db" not in parsed and urlsplit(url).scheme != "unix" and path and not path.isdigit():
        raise ValueError(f"REDIS_URL's path {path!r} is not a database number")  # redis-py would ignore it
    db = parsed.get("db", 0)
    if not isinstance(db, int) or not 0 <= db < REDIS_DATABASES:
        raise ValueError(f"REDIS_URL names database {db!r}; Redis has {REDIS_DATABASES} (0-{REDIS_DATABASES - 1})")
    return db


def with_db(url: str, db: int) -> str:
    """``url`` naming database ``db``: where it stood (the query or the path), everything else kept."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    path = parts.path
    if any(name == "db" for name, _ in query):
        query = [(name, str(db) if name == "db" else value) for name, value in query]
    elif parts.scheme == "unix":  # the path is the socket: the number can only go in the query
        query.append(("db", str(db)))
    else:
        path = f"/{db}"
    # Not urlunsplit: it drops the "//" of unix:///path (an empty host).
    return f"{parts.scheme}://{parts.netloc}{path}" + (f"?{urlencode(query)}" if query else "")


def worker_redis_urls(url: str, *, workers: int, reserved: int | None = None) -> list[str]:
    """One Redis URL per xdist worker (index order): REDIS_URL's database, then the next ones.

    ``reserved`` is how many databases a launcher set aside for this run (devtools.embedded's
    ``KOALA_EMBEDDED_REDIS_DBS``); beyond them a worker would share another launcher's database.
    """
    base = redis_db(url)
    last = base + workers - 1
    if last >= REDIS_DATABASES:
        raise TooManyWorkers(
            f"{workers} workers need Redis databases {base}-{last} (one each, from REDIS_URL's {base}), "
            f"but Redis has {REDIS_DATABASES} (0-{REDIS_DATABASES - 1}): run at most {REDIS_DATABASES - base} workers "
            f"(-n), or point REDIS_URL at a lower database number"
        )
    if reserved is not None and workers > reserved:
        raise TooManyWorkers(
            f"devtools.embedded reserved {reserved} Redis databases for this run (KOALA_EMBEDDED_REDIS_DBS), "
            f"one per worker, and {workers} workers were asked for: run make test TEST_WORKERS={workers} "
            f"(it reserves as many as it starts) instead of passing -n in PYTEST_ARGS"
        )
    return [with_db(url, base + index) for index in range(workers)]


# -- the order tests are handed out in ------------------------------------------------------------
def _database_group(item: pytest.Item) -> int:
    """pytest-django's order (Django's): 0 in a rolled-back transaction, 1 transactional (flushes
    every table after, data migrations' rows included), 2 no database. Mirrors its sort key."""
    marker = item.get_closest_marker("django_db")
    fixtures = getattr(item, "fixturenames", ())
    if marker is not None:
        transaction, reset_sequences, *_ = validate_django_db(marker)
        if transaction or reset_sequences:
            return 1
    if "transactional_db" in fixtures or "live_server" in fixtures:
        return 1
    return 0 if marker is not None or "db" in fixtures else 2


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder so that the long tests (``slow``: they start processes) start first and the short ones
    fill in at the end, without breaking pytest-django's order where it matters: in each worker's
    database, rolled-back tests run before transactional ones (a flush removes the rows data
    migrations made, which rolled-back tests may rely on). ``--dist load`` hands each worker tests
    in this order, so every worker keeps it. Tests without a database go anywhere: their slow ones
    first of all, the rest last."""

    def rank(item: pytest.Item) -> tuple[int, int]:
        group, slow = _database_group(item), item.get_closest_marker("slow") is not None
        if group == 2:
            return (-1, 0) if slow else (3, 0)
        return (group, 0 if slow else 1)

    items.sort(key=rank)  # stable: within a rank, the collection order


# -- tests that must have the machine to themselves ---------------------------------------------
TURNS = "KOALA_TEST_TURNS"  # in each worker: the run's folder of turn locks (set by the controller)


@contextmanager
def turn(folder: str | None, *, alone: bool) -> Iterator[None]:
    """Hold a turn to run one test. Every test of a parallel run holds ``running`` shared; an
    ``alone`` test (its assertion is a wall-clock bound on work this machine does) holds it
    exclusively, so no other test runs beside it. ``gate`` keeps newcomers out while an alone
    test waits for the running ones to finish (flock would let shared holders starve it).
    Serially (``folder`` None) there is nobody to wait for."""
    if folder is None:
        yield
        return
    with open(Path(folder) / "gate", "a") as gate, open(Path(folder) / "running", "a") as running:
        fcntl.flock(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)  # the next alone test may close the gate behind this one
        try:
            yield
        finally:
            fcntl.flock(running, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
