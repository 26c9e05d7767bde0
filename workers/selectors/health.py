"""Is this deployment ready to serve (``/readyz``)? Reads only, and says nothing but yes or no.

Three checks, each cheap: PostgreSQL answers (the migration recorder's one SELECT proves it),
Redis answers a PING, and every leaf migration on disk is recorded as applied. The leaves are
read from the migration files once per process: the files of a running release do not change,
and loading the graph on every probe would cost more than the rest of the check.
"""

from __future__ import annotations

from functools import cache

from django.db import DatabaseError, connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from redis.exceptions import RedisError

from workers import doorbell

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"


@cache
def _leaf_migrations() -> frozenset[tuple[str, str]]:
    # No connection: only the files on disk (what this release expects to have been applied).
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())


def readiness() -> dict[str, str]:
    """``{"database": …, "redis": …, "migrations": …}``, each ``ok``, ``failed`` or ``unknown``
    (migrations cannot be judged without the database). Errors are swallowed, never shown: a
    probe's answer must not carry hosts, versions or an error's text."""
    checks = {"database": OK, "redis": OK, "migrations": OK}
    try:
        applied = set(MigrationRecorder(connection).applied_migrations())
    except DatabaseError:
        checks["database"], checks["migrations"] = FAILED, UNKNOWN
    else:
        if not _leaf_migrations() <= applied:
            checks["migrations"] = FAILED
    try:
        doorbell.redis_connection().ping()
    except (RedisError, OSError):
        checks["redis"] = FAILED
    return checks


def ready(checks: dict[str, str]) -> bool:
    return all(value == OK for value in checks.values())
