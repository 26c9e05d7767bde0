"""The floor for bench/compare.py: the raw PostgreSQL claim loop, a durable row per job.

    DATABASE_URL=... REDIS_URL=... python -m bench.peers.pg_floor ROLE ...

Nothing but psycopg and redis (it runs in either venv). ``enqueue`` INSERTs one row per job, one
commit each. Each ``worker`` process loops: one transaction claims the oldest queued row
(``FOR UPDATE SKIP LOCKED``), runs the body (the Redis ``INCR``) and marks the row succeeded,
then commits: 1 row per transaction, no attempt row, lease, fence or ledger. An empty claim
sleeps 2 ms. psycopg prepares the claim after 5 executions. Roles: bench/peers/_protocol.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.peers import _protocol

SCHEMA = "bench_floor"
CREATE = [
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE TABLE IF NOT EXISTS {SCHEMA}.job (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'queued', "
    "input jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz)",
    f"CREATE INDEX IF NOT EXISTS job_queued_idx ON {SCHEMA}.job (id) WHERE state = 'queued'",
]
INSERT = f"INSERT INTO {SCHEMA}.job (input) VALUES (%s)"
# One row per transaction: claim the oldest queued row and mark it done in the same statement;
# SKIP LOCKED lets the other process claim the next row instead of waiting on this one.
CLAIM = (
    f"UPDATE {SCHEMA}.job SET state = 'succeeded', finished_at = now() WHERE id = ("
    f"SELECT id FROM {SCHEMA}.job WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING input"
)


def floor_problems(*, counter: int, jobs: int, states: dict[str, int]) -> list[str]:
    return _protocol.counter_problems(counter, jobs) + _protocol.status_problems(
        states, jobs, done="succeeded", what="floor job states"
    )


def redis_client() -> Any:
    from redis import Redis

    return Redis.from_url(os.environ["REDIS_URL"], socket_timeout=10, socket_connect_timeout=5)


def connect() -> Any:
    import psycopg

    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def reset(args: Any, channel: _protocol.Channel) -> int:
    with connect() as conn:
        for statement in CREATE:
            conn.execute(statement)
        conn.execute(f"TRUNCATE {SCHEMA}.job RESTART IDENTITY")
    redis_client().delete(args.key)
    channel.send({"ok": True})
    return 0


def worker(args: Any, channel: _protocol.Channel) -> int:
    from psycopg.types.json import Jsonb  # noqa: F401  (imported before "go", as the enqueue side)

    conn = connect()
    client = redis_client()
    client.ping()
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    if not channel.hold():
        return 0
    channel.send("waiting")
    while not stopping:
        with conn.transaction():
            row = conn.execute(CLAIM).fetchone()
            if row is not None:
                client.incr(row[0]["key"])
        if row is None:
            time.sleep(0.002)
    conn.close()
    return 0


def enqueue(args: Any, channel: _protocol.Channel) -> int:
    from psycopg.types.json import Jsonb

    conn = connect()
    if not channel.hold():
        return 0
    start = time.time()
    for _ in range(args.jobs):
        conn.execute(INSERT, [Jsonb({"key": args.key})])
    channel.send({"start": start, "end": time.time()})
    conn.close()
    return 0


def verify(args: Any, channel: _protocol.Channel) -> int:
    with connect() as conn:
        rows = conn.execute(f"SELECT state, count(*) FROM {SCHEMA}.job GROUP BY state").fetchall()
    counter = int(redis_client().get(args.key) or 0)
    channel.send({"problems": floor_problems(counter=counter, jobs=args.jobs, states=dict(rows))})
    return 0


def drop(args: Any, channel: _protocol.Channel) -> int:
    with connect() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    channel.send({"ok": True})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return _protocol.main(
        sys.argv[1:] if argv is None else argv,
        name="pg_floor",
        description=__doc__.split("\n\n")[0],
        needs=["DATABASE_URL", "REDIS_URL"],
        roles={"reset": reset, "worker": worker, "enqueue": enqueue, "verify": verify, "drop": drop},
    )


if __name__ == "__main__":
    sys.exit(main())
