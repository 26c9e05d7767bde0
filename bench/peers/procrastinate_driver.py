"""Procrastinate 3 peer for bench/compare.py, on PostgreSQL (DATABASE_URL) in a schema of its own.

    DATABASE_URL=postgres://root@127.0.0.1:5432/koala_peers_bench REDIS_URL=redis://127.0.0.1:6379/8 \\
        .venv-peers/bin/python -m bench.peers.procrastinate_driver ROLE ...

Its tables, types and functions live in the ``bench_procrastinate`` schema (``reset`` applies
Procrastinate's schema there, ``drop`` removes it), so they never mix with Koala's. Each worker
process runs ``App.run_worker`` with concurrency 1, LISTEN/NOTIFY on (a deferred job wakes a
waiting worker), the default 5 s polling fallback and ``delete_jobs="never"``: every job keeps
its row, as Koala's do. Jobs are deferred one by one with ``task.defer()`` (one INSERT and
commit each). Roles: bench/peers/_protocol.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.peers import _protocol

SCHEMA = "bench_procrastinate"


def conninfo(database_url: str) -> str:
    """DATABASE_URL with the driver's schema first on the search path."""
    from psycopg.conninfo import make_conninfo

    return make_conninfo(database_url, options=f"-c search_path={SCHEMA}")


def make_app(database_url: str, queue: str, key_client: Any = None) -> tuple[Any, Any]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=conninfo(database_url)))

    @app.task(name="bench.incr", queue=queue)
    def incr(key: str) -> int:
        return int(key_client.incr(key))

    return app, incr


def redis_client() -> Any:
    from redis import Redis

    return Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10, socket_connect_timeout=5)


def procrastinate_problems(*, counter: int, jobs: int, statuses: dict[str, int]) -> list[str]:
    return _protocol.counter_problems(counter, jobs) + _protocol.status_problems(
        statuses, jobs, done="succeeded", what="procrastinate_jobs statuses"
    )


def reset(args: Any, channel: _protocol.Channel) -> int:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        present = conn.execute("SELECT to_regclass(%s)", [f"{SCHEMA}.procrastinate_jobs"]).fetchone()
        if present is None or present[0] is None:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
            app, _ = make_app(os.environ["DATABASE_URL"], args.queue)
            with app.open():
                app.schema_manager.apply_schema()
        conn.execute(
            f"TRUNCATE {SCHEMA}.procrastinate_jobs, {SCHEMA}.procrastinate_events, "
            f"{SCHEMA}.procrastinate_periodic_defers, {SCHEMA}.procrastinate_workers RESTART IDENTITY CASCADE"
        )
    redis_client().delete(args.key)
    channel.send({"ok": True})
    return 0


def worker(args: Any, channel: _protocol.Channel) -> int:
    import asyncio

    app, _ = make_app(os.environ["DATABASE_URL"], args.queue, redis_client())
    if not channel.hold():
        return 0

    async def run() -> None:
        async with app.open_async():
            channel.send("waiting")
            await app.run_worker_async(
                queues=[args.queue],
                name=f"bench{args.index}",
                concurrency=1,
                wait=True,
                listen_notify=True,
                delete_jobs="never",
                install_signal_handlers=True,
            )

    asyncio.run(run())
    return 0


def enqueue(args: Any, channel: _protocol.Channel) -> int:
    app, incr = make_app(os.environ["DATABASE_URL"], args.queue)
    with app.open():
        if not channel.hold():
            return 0
        start = time.time()
        for _ in range(args.jobs):
            incr.defer(key=args.key)
        channel.send({"start": start, "end": time.time()})
    return 0


def verify(args: Any, channel: _protocol.Channel) -> int:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        rows = conn.execute(f"SELECT status::text, count(*) FROM {SCHEMA}.procrastinate_jobs GROUP BY status").fetchall()
    counter = int(redis_client().get(args.key) or 0)
    channel.send({"problems": procrastinate_problems(counter=counter, jobs=args.jobs, statuses=dict(rows))})
    return 0


def drop(args: Any, channel: _protocol.Channel) -> int:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    channel.send({"ok": True})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return _protocol.main(
        sys.argv[1:] if argv is None else argv,
        name="procrastinate_driver",
        description=__doc__.split("\n\n")[0],
        needs=["DATABASE_URL", "REDIS_URL"],
        roles={"reset": reset, "worker": worker, "enqueue": enqueue, "verify": verify, "drop": drop},
    )


if __name__ == "__main__":
    sys.exit(main())
