"""Celery 5 peer for bench/compare.py: the Redis broker (REDIS_URL), no result backend, the solo pool.

    REDIS_URL=redis://127.0.0.1:6379/8 .venv-peers/bin/python -m bench.peers.celery_driver ROLE ...

Celery's defaults are kept, so a message is acknowledged just before its task runs (early ack:
a worker that dies mid-task loses that job) and each worker prefetches 4 messages. Task results
are ignored and no result backend is configured: nothing is kept per job. Roles: bench/peers/_protocol.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.peers import _protocol

# kombu's Redis transport keeps prefetched, not yet acknowledged messages here.
UNACKED = ("unacked", "unacked_index")


def broker_url(redis_url: str) -> str:
    """kombu's name for a Redis URL: redis-py's ``unix:///path.sock?db=N`` (the embedded Redis
    ``make test`` starts) is kombu's ``redis+socket:///path.sock?virtual_host=N``; a TCP URL is
    the same in both."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(redis_url)
    if parts.scheme != "unix":
        return redis_url
    db = parse_qs(parts.query).get("db", ["0"])[0]
    return f"redis+socket://{parts.path}?virtual_host={db}"


def make_app(redis_url: str, queue: str) -> tuple[Any, Any]:
    from celery import Celery
    from redis import Redis

    client = Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    app = Celery("bench_peers", broker=broker_url(redis_url), set_as_current=True)
    app.conf.update(
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
    )

    @app.task(name="bench.incr")
    def incr(key: str) -> int:
        return int(client.incr(key))

    return app, incr


def celery_problems(*, counter: int, jobs: int, queued: int, unacked: int) -> list[str]:
    problems = _protocol.counter_problems(counter, jobs)
    if queued:
        problems.append(f"{queued} messages left in the queue")
    if unacked:
        problems.append(f"{unacked} messages delivered but never acknowledged")
    return problems


def reset(args: Any, channel: _protocol.Channel) -> int:
    from redis import Redis

    Redis.from_url(os.environ["REDIS_URL"]).delete(args.queue, args.key, *UNACKED)
    channel.send({"ok": True})
    return 0


def worker(args: Any, channel: _protocol.Channel) -> int:
    from celery.signals import worker_ready

    app, _ = make_app(os.environ["REDIS_URL"], args.queue)
    worker_ready.connect(lambda **_: channel.send("waiting"), weak=False)
    if not channel.hold():
        return 0
    app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--loglevel=WARNING",
            f"--queues={args.queue}",
            f"--hostname=bench{args.index}@%h",
        ]
    )
    return 0


def enqueue(args: Any, channel: _protocol.Channel) -> int:
    app, incr = make_app(os.environ["REDIS_URL"], args.queue)
    with app.connection_for_write() as conn:
        conn.ensure_connection()
    if not channel.hold():
        return 0
    start = time.time()
    for _ in range(args.jobs):
        incr.delay(args.key)
    channel.send({"start": start, "end": time.time()})
    return 0


def verify(args: Any, channel: _protocol.Channel) -> int:
    from redis import Redis

    conn = Redis.from_url(os.environ["REDIS_URL"])
    unacked = int(conn.hlen(UNACKED[0]) or 0)
    channel.send(
        {
            "problems": celery_problems(
                counter=int(conn.get(args.key) or 0), jobs=args.jobs, queued=int(conn.llen(args.queue)), unacked=unacked
            )
        }
    )
    return 0


def drop(args: Any, channel: _protocol.Channel) -> int:
    return reset(args, channel)


def main(argv: Sequence[str] | None = None) -> int:
    return _protocol.main(
        sys.argv[1:] if argv is None else argv,
        name="celery_driver",
        description=__doc__.split("\n\n")[0],
        needs=["REDIS_URL"],
        roles={"reset": reset, "worker": worker, "enqueue": enqueue, "verify": verify, "drop": drop},
    )


if __name__ == "__main__":
    sys.exit(main())
