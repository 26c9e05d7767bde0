"""Redis/RQ as a doorbell: a message wakes a worker, the database decides the work.

A message carries only the Koala job id and contract version. A worker woken by
one claims that job and then drains a bounded batch of due jobs from PostgreSQL,
so RQ's per-message overhead is paid per wake rather than per job.

Ringing is bounded by the queue's pending message count (``KOALA_DOORBELL_DEPTH``).
Why skipping a ring is safe: if we see N >= depth pending messages *after* our
job committed, each of those messages will be dequeued by a worker that then
queries PostgreSQL, and that query starts after our commit, so it sees our job.
The dispatcher (koala_beat) rings for any due job left over, which also covers
Redis losing everything (restart without persistence, FLUSHALL, failover).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.conf import settings
from redis import Redis
from rq import Queue
from rq.queue import EnqueueData

log = logging.getLogger(__name__)

ENTRY = "workers.runtime.deliver"
_connection: Redis | None = None


def redis_connection() -> Redis:
    global _connection
    if _connection is None:
        _connection = Redis.from_url(settings.REDIS_URL, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30)
    return _connection


def reset_connection() -> None:
    """Forget the client (after fork, or when tests point REDIS_URL elsewhere)."""
    global _connection
    _connection = None


def rq_queue(name: str) -> Queue:
    return Queue(name, connection=redis_connection(), default_timeout=-1)


def ring(queue: str, jobs: Iterable[tuple[int, int]], *, depth: int | None = None) -> int:
    """Push messages for (job_id, version) pairs until the queue holds ``depth`` pending.

    Returns the number pushed. Never raises: a failed ring is repaired by the
    dispatcher from database state, so it must not fail the caller's request.
    """
    limit = settings.KOALA_DOORBELL_DEPTH if depth is None else depth
    try:
        q = rq_queue(queue)
        room = limit - q.count
        if room <= 0:
            return 0
        batch: list[EnqueueData] = []
        for job_id, version in jobs:
            if len(batch) >= room:
                break
            batch.append(
                Queue.prepare_data(
                    ENTRY, args=(job_id, version), timeout=-1, result_ttl=0, failure_ttl=86400, description=f"koala job {job_id}"
                )
            )
        if batch:
            q.enqueue_many(batch)
        return len(batch)
    except Exception as exc:  # Redis down: the dispatcher re-rings from PostgreSQL later
        log.warning("doorbell for queue %s failed (%s); the dispatcher will re-ring", queue, type(exc).__name__)
        return 0
