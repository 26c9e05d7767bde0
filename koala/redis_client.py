"""The one place Koala makes a Redis client: a URL's server, or a Redis Sentinel group's master.

Configured by ``REDIS_URL``, or by ``KOALA_REDIS_SENTINELS`` + ``KOALA_REDIS_SENTINEL_MASTER``
(koala/settings.py refuses both, docs/configuration.md "Redis"). django-rq's pages build their
own clients from ``RQ_QUEUES``, which settings derive from the same values.

With Sentinel the client is ``Sentinel(...).master_for(name)``: every new connection asks a
sentinel for the current master, so after a failover the next connection goes to the promoted
replica. What makes an old connection end soon enough to need a new one:

- a killed or restarted master closes its sockets: the next command fails at once and
  redis-py's retries reconnect (through the sentinels) with a backoff capped at 1 s;
- a frozen or partitioned master answers nothing: ``socket_timeout``
  (KOALA_REDIS_SOCKET_TIMEOUT_SECONDS, 3 s) ends every command, and an RQ worker's blocking
  pop after its own timeout + 2 s (4 s, workers/rq_workers.py ``connection_timeout``);
- a demoted master (it came back and was made a replica) answers writes with READONLY, which
  redis-py's Sentinel connection turns into a reconnect, and blocked pops with UNBLOCKED,
  which ends RQ's loop (workers/rq_workers.py restarts it).

The sentinels themselves get short timeouts (1 s): asking one is a local round trip, and a dead
one must not delay the question to the next.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from redis import Redis
from redis.sentinel import Sentinel

SENTINEL_TIMEOUT_SECONDS = 1.0


def sentinel_mode() -> bool:
    return bool(getattr(settings, "KOALA_REDIS_SENTINELS", None))


def describe() -> str:
    """Where Redis is, for an error message (no password)."""
    if sentinel_mode():
        hosts = ",".join(f"{host}:{port}" for host, port in settings.KOALA_REDIS_SENTINELS)
        return f"Sentinel master {settings.KOALA_REDIS_SENTINEL_MASTER!r} via {hosts}"
    return "REDIS_URL"


def connect(
    *, socket_timeout: float | None = None, socket_connect_timeout: float = 5.0, health_check_interval: int = 30
) -> Redis:
    """A new client (its own connection pool). ``socket_timeout`` defaults to
    KOALA_REDIS_SOCKET_TIMEOUT_SECONDS; None there means the setting, never "wait forever"."""
    timeout = float(settings.KOALA_REDIS_SOCKET_TIMEOUT_SECONDS) if socket_timeout is None else socket_timeout
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "health_check_interval": health_check_interval,
    }
    if not sentinel_mode():
        return Redis.from_url(settings.REDIS_URL, **options)
    sentinel = Sentinel(
        settings.KOALA_REDIS_SENTINELS,
        sentinel_kwargs={
            "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
            "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS,
            "password": settings.KOALA_REDIS_SENTINEL_PASSWORD or None,
        },
    )
    return sentinel.master_for(
        settings.KOALA_REDIS_SENTINEL_MASTER,
        db=settings.KOALA_REDIS_DB,
        password=settings.KOALA_REDIS_PASSWORD or None,
        **options,
    )
