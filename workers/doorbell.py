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
from typing import Any

from django.conf import settings
from redis import Redis
from rq import Queue, get_current_job
from rq.queue import EnqueueData

from koala import redis_client

log = logging.getLogger(__name__)

ENTRY = "workers.runtime.deliver"
# Published with the queue's name on every ring (channel("doorbell")): the HTTP worker API's
# long-poll (api.poller) subscribes, so waiting HTTP workers wake when work comes due, like RQ
# workers blocked in BLPOP. A hint only: a missed message costs at most one poll interval
# (KOALA_API_POLL_SECONDS).
HOPS = "koala_hops"  # message meta: how many workers have passed this doorbell on (see pass_on)
_connection: Redis | None = None


def redis_connection() -> Redis:
    global _connection
    if _connection is None:
        _connection = redis_client.connect()
    return _connection


def reset_connection() -> None:
    """Forget the client (after fork, or when tests point REDIS_URL or the sentinels elsewhere)."""
    global _connection
    _connection = None


def channel(name: str) -> str:
    """A pub/sub channel of this deployment. Pub/sub is server-wide in Redis, not per database
    number, so the name carries the configured database (REDIS_URL's or KOALA_REDIS_DB): two deployments sharing one Redis server
    on different databases never wake each other's pollers."""
    db = redis_connection().connection_pool.connection_kwargs.get("db", 0)
    return f"koala:{db}:{name}"


def rq_queue(name: str) -> Queue:
    return Queue(name, connection=redis_connection(), default_timeout=-1)


def _message(job_id: int, version: int, **extra: Any) -> EnqueueData:
    """One doorbell: the job id and contract version only; RQ keeps no result and no retry."""
    return Queue.prepare_data(
        ENTRY, args=(job_id, version), timeout=-1, result_ttl=0, failure_ttl=86400, description=f"koala job {job_id}", **extra
    )


def ring(queue: str, jobs: Iterable[tuple[int, int]], *, depth: int | None = None) -> int:
    """Push messages for (job_id, version) pairs until the queue holds ``depth`` pending.

    Returns the number pushed. Never raises: a failed ring is repaired by the
    dispatcher from database state, so it must not fail the caller's request.
    """
    limit = settings.KOALA_DOORBELL_DEPTH if depth is None else depth
    try:
        q = rq_queue(queue)
        # The wake-up for HTTP pollers and the pending count in one round trip: when a ring is
        # already pending (the queue is at its depth) this is all the Redis work an enqueue does.
        pipe = redis_connection().pipeline(transaction=False)
        pipe.publish(channel("doorbell"), queue)
        pipe.llen(q.key)
        _published, pending = pipe.execute()
        room = limit - int(pending)
        if room <= 0:
            return 0
        batch: list[EnqueueData] = []
        for job_id, version in jobs:
            if len(batch) >= room:
                break
            batch.append(_message(job_id, version))
        if batch:
            q.enqueue_many(batch)
        return len(batch)
    except Exception as exc:  # Redis down: the dispatcher re-rings from PostgreSQL later
        log.warning("doorbell for queue %s failed (%s); the dispatcher will re-ring", queue, type(exc).__name__)
        return 0


def hops() -> int:
    """How many workers passed on the doorbell being handled now (0: a first ring, or no RQ)."""
    current = get_current_job()
    return int(current.meta.get(HOPS, 0)) if current is not None else 0


def pass_on(queue: str, job_id: int, version: int, *, hops: int) -> bool:
    """Put back, at the head of the queue, a doorbell this worker took but cannot serve.

    Why at the head and why this reaches a capable worker: Redis hands a pushed message to
    the client that has been blocked in BLPOP longest, and a worker that passes a message
    on is busy, then queues up behind everyone already waiting. So each worker that cannot
    serve the job takes it at most once before a waiting capable worker does, and the caller
    bounds ``hops`` by the number of such workers: no loop between old workers while the
    capable ones are all busy (they find the job with their own next claim, or the dispatcher
    rings again). The message replaces the one consumed, so the queue's depth bound does
    not apply. Never raises, like ``ring``.
    """
    try:
        rq_queue(queue).enqueue_many([_message(job_id, version, at_front=True, meta={HOPS: hops})])
        return True
    except Exception as exc:
        log.warning("passing on the doorbell for job %s failed (%s); the dispatcher will re-ring", job_id, type(exc).__name__)
        return False
