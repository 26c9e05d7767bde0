"""What every benchmark does first: configure Django from the environment, and refuse to
write into a database or Redis db that is not obviously a scratch one."""

from __future__ import annotations

import os
import secrets
import sys


def setup_django(**environment: str) -> None:
    for name in ("DATABASE_URL", "REDIS_URL"):
        if not os.environ.get(name):
            sys.exit(f"{name} is not set (see bench/README.md)")
    # A benchmark never serves HTTP; any strong key satisfies the settings and the checks.
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "koala.settings")
    os.environ.update(environment)
    import django

    django.setup()


def guard(*, force: bool, database_action: str, redis_action: str) -> None:
    """Exit unless the database name contains "bench" and Redis is not db 0 (or ``force``)."""
    from django.db import connection
    from redis import Redis

    name = connection.settings_dict["NAME"]
    db = Redis.from_url(os.environ["REDIS_URL"]).connection_pool.connection_kwargs.get("db", 0)
    if force:
        return
    if "bench" not in name:
        sys.exit(f"refusing to {database_action} in database {name!r}: use a database named *bench* or pass --force")
    if int(db) == 0:
        sys.exit(f"refusing to {redis_action} Redis db 0: point REDIS_URL at another db (e.g. /5) or pass --force")
