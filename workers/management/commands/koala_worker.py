from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli, redis_client
from workers import doorbell
from workers.dbsession import bound_sessions
from workers.management.commands._common import queue_list
from workers.models import WorkerProcess
from workers.rq_workers import WORKER_CLASSES, KoalaWorkerPool, WorkerNameInUse, check_worker_name, default_worker_name


def _worker_name(value: str) -> str:
    """A name django-rq's pages can link to (rq_workers.check_worker_name), checked before anything registers."""
    name = cli.field_text(WorkerProcess, "name")(value)
    problem = check_worker_name(name)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return name


class Command(BaseCommand):
    help = (
        "Run a Koala worker: RQ wakes it, PostgreSQL decides what it runs. "
        "SIGTERM/Ctrl-C stops claiming, lets the running job finish within --shutdown-deadline, then releases it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=",".join(settings.RQ_QUEUES),
            help="configured queues (KOALA_QUEUES), comma-separated, in priority order (default: all)",
        )
        parser.add_argument(
            "--name",
            type=_worker_name,
            default=None,
            help="worker name (default: host.pid); must be unique while running",
        )
        parser.add_argument(
            "--worker-class",
            choices=sorted(WORKER_CLASSES),
            default="simple",
            help="simple: run bodies in this process (fastest); fork: a fresh process per wake (isolation)",
        )
        parser.add_argument(
            "--pool", type=cli.bounded_int(1, 64), default=1, help="number of worker processes, 1-64 (RQ WorkerPool when > 1)"
        )
        parser.add_argument(
            "--shutdown-deadline",
            type=cli.finite_float(0.0, 86_400.0),
            default=None,
            help="seconds a running job gets after SIGTERM before it is released "
            f"(default KOALA_SHUTDOWN_DEADLINE_SECONDS={settings.KOALA_SHUTDOWN_DEADLINE_SECONDS:g})",
        )
        parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")

    def handle(self, *args: Any, **options: Any) -> None:
        queues: list[str] = options["queues"]
        if options["pool"] > 1 and options["name"]:
            raise CommandError("--name cannot be combined with --pool; pool workers name themselves.")
        # A write to a pipe whose reader is gone must raise (and be dropped by the log handler),
        # never kill the worker before it stops gracefully and records the stop. Python ignores
        # SIGPIPE at start-up; say so here rather than depend on how we were started.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        deadline = options["shutdown_deadline"]
        worker_class = WORKER_CLASSES[options["worker_class"]]
        # Every session of this process (and of pool children and fork horses, which inherit
        # the receiver) bounds its waits below the lease: see workers/dbsession.py.
        bound_sessions()
        worker_class.shutdown_deadline = deadline  # type: ignore[union-attr]
        connection = doorbell.redis_connection()
        try:
            connection.ping()
        except Exception as exc:
            raise CommandError(f"cannot reach Redis at {redis_client.describe()}: {type(exc).__name__}: {exc}") from None
        # RQ sets its loggers to the level work() is given. Give it the one LOGGING configures for
        # rq.worker (WARNING unless LOG_LEVEL=DEBUG): its INFO lines, three or four per doorbell,
        # name the RQ message, not the job; Koala logs one line per attempt instead (workers/runtime.py).
        level = logging.getLevelName(logging.getLogger("rq.worker").getEffectiveLevel())
        if options["pool"] > 1:
            pool = KoalaWorkerPool(queues, connection=connection, num_workers=options["pool"], worker_class=worker_class)
            pool.start(burst=options["burst"], logging_level=level)
            return
        worker = worker_class(
            [doorbell.rq_queue(q) for q in queues], connection=connection, name=options["name"] or default_worker_name()
        )
        try:
            worker.work(burst=options["burst"], logging_level=level)
        except WorkerNameInUse as exc:
            raise CommandError(str(exc)) from None
        finally:
            _quiet_if_unread()


def _quiet_if_unread() -> None:
    """If stdout/stderr lost their reader, point them at /dev/null before the interpreter's
    final flush, which would otherwise fail and turn a clean stop into exit status 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # EPIPE: the reader is gone
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
