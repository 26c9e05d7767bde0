"""Job bodies for the raw-RQ baseline: the same side effect as Koala's ``incr`` kind."""

from __future__ import annotations

import os

from redis import Redis

_client: Redis | None = None


def incr(key: str) -> int:
    """INCR a Redis counter (one client per worker process, like workers.doorbell)."""
    global _client
    if _client is None:
        _client = Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10, socket_connect_timeout=5)
    return int(_client.incr(key))
