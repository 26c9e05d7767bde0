from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from koala import cli
from workers.dbsession import bound_sessions
from workers.services import retention
from workers.services.maintenance import dispatch, reap, safety_tick

log = logging.getLogger("koala.beat")


def _worth_logging(result: Any) -> bool:
    """A beat task's result says something happened: a non-zero count (or a mapping holding one)."""
    if isinstance(result, Mapping):
        return any(result.values())
    return bool(result)


def _loggable(result: Any) -> str:
    if isinstance(result, Mapping):
        return " ".join(f"{key}={value}" for key, value in result.items())
    return str(result)


class Command(BaseCommand):
    help = (
        "Run the dispatcher and reaper loop: requeue or fail expired leases, fail jobs past their deadline, "
        "lift expired pauses, unpark jobs whose budget has room, trip the circuit breaker, run the installed apps' "
        "beat tasks (undecided reviews expire, exports settle), re-ring RQ for every due job from database "
        "state, and every KOALA_RETENTION_INTERVAL_SECONDS prune finished jobs older than KOALA_RETENTION_DAYS in "
        "bounded batches. Any number of replicas may run."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            # The setting's own floor; NaN would make every wait return at once (a busy loop).
            type=cli.finite_float(0.05, 3600.0),
            default=settings.KOALA_BEAT_INTERVAL_SECONDS,
            help="seconds between ticks, 0.05-3600 (default KOALA_BEAT_INTERVAL_SECONDS)",
        )
        parser.add_argument("--once", action="store_true", help="run one tick and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"]
        # The reaper takes over stale attempts' jobs: its sessions must never queue behind a
        # partitioned worker's transaction for long (workers/dbsession.py).
        bound_sessions()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        prune_at = 0.0  # monotonic: the first tick prunes, then every KOALA_RETENTION_INTERVAL_SECONDS
        while True:
            try:
                report = reap()
                # The safety layer's steps, then each installed app's beat task (workers.hooks):
                # reviews past their time end their job, engine-decided outcomes reach their exports.
                safety = safety_tick()
                for name, result in safety.tasks.items():
                    if _worth_logging(result):
                        log.info("beat: %s %s", name, _loggable(result))
                rung = dispatch()
                if safety.pauses_lifted or safety.unparked or safety.breakers_tripped:
                    log.info(
                        "beat: pauses_lifted=%d unparked=%d breakers_tripped=%s",
                        safety.pauses_lifted,
                        safety.unparked,
                        ",".join(safety.breakers_tripped) or "-",
                    )
                if report.orphaned or report.requeued or report.failed or report.deadline_failed or rung:
                    log.info(
                        "beat: orphaned=%d requeued=%d failed=%d deadline_failed=%d rung=%d",
                        report.orphaned,
                        report.requeued,
                        report.failed,
                        report.deadline_failed,
                        rung,
                    )
                # Last, so a long backlog of old jobs never delays reaping or dispatch; bounded
                # (KOALA_RETENTION_BATCHES batches), the rest waits for the next pass.
                if time.monotonic() >= prune_at:
                    prune_at = time.monotonic() + settings.KOALA_RETENTION_INTERVAL_SECONDS
                    pruned = retention.prune()
                    if pruned.jobs or pruned.kept:
                        log.info("beat: retention %s", _loggable(pruned.loggable()))
            except Exception as exc:  # a database blip must not kill the beat; the next tick retries
                log.warning("beat tick failed: %s: %s", type(exc).__name__, exc)
                connection.close()
                if options["once"]:
                    raise
            if options["once"] or stop.wait(interval):
                break
