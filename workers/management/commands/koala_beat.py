from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers import hooks
from workers.dbsession import bound_sessions
from workers.selectors.beat import beat_health
from workers.services.maintenance import TickReport, beat_identity, beat_tick

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


def _log_tick(report: TickReport) -> None:
    for name, step in report.steps.items():
        if name not in hooks.ENGINE_BEAT_STEPS and not step.error and _worth_logging(step.result):
            log.info("beat: %s %s", name, _loggable(step.result))
    lifted, unparked = report.result("pauses") or 0, report.result("budgets") or 0
    tripped = report.result("breakers") or []
    if lifted or unparked or tripped:
        log.info("beat: pauses_lifted=%d unparked=%d breakers_tripped=%s", lifted, unparked, ",".join(tripped) or "-")
    reaped, rung = report.result("reap"), report.result("dispatch") or 0
    orphaned, requeued, failed, deadline_failed = (
        (reaped.orphaned, reaped.requeued, reaped.failed, reaped.deadline_failed) if reaped else (0, 0, 0, 0)
    )
    if orphaned or requeued or failed or deadline_failed or rung:
        log.info(
            "beat: orphaned=%d requeued=%d failed=%d deadline_failed=%d rung=%d",
            orphaned,
            requeued,
            failed,
            deadline_failed,
            rung,
        )
    pruned = report.result("retention")
    if pruned is not None and (pruned.jobs or pruned.kept):
        log.info("beat: retention %s", _loggable(pruned.loggable()))


def _when(moment: Any) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}Z" if moment else "never"


class Command(BaseCommand):
    help = (
        "Run the dispatcher and reaper loop: requeue or fail expired leases, fail jobs past their deadline, "
        "lift expired pauses, unpark jobs whose budget has room, trip the circuit breaker, run the installed apps' "
        "beat tasks (undecided reviews expire, exports settle), re-ring RQ for every due job from database "
        "state, and every KOALA_RETENTION_INTERVAL_SECONDS prune finished jobs older than KOALA_RETENTION_DAYS in "
        "bounded batches (one pass among all replicas). Each step is isolated: a failure is logged, counted in the "
        "step's last-tick record and retried next tick; dispatch always runs. Any number of replicas may run. "
        "--status prints each step's last tick and exits 1 if one is stale or failing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--interval",
            # The setting's own floor; NaN would make every wait return at once (a busy loop).
            type=cli.finite_float(0.05, 3600.0),
            default=settings.KOALA_BEAT_INTERVAL_SECONDS,
            help="seconds between ticks, 0.05-3600 (default KOALA_BEAT_INTERVAL_SECONDS)",
        )
        parser.add_argument("--once", action="store_true", help="run one tick and exit (exit 1 if a step failed)")
        parser.add_argument(
            "--status",
            action="store_true",
            help="print each step's last tick (any replica's) and exit: 0 all fresh, 1 a step stale or failing",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["status"]:
            self._status()
            return
        interval = options["interval"]
        # The reaper takes over stale attempts' jobs: its sessions must never queue behind a
        # partitioned worker's transaction for long (workers/dbsession.py).
        bound_sessions()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
        beat = beat_identity()
        prune_at = 0.0  # monotonic: the first tick tries to prune, then every KOALA_RETENTION_INTERVAL_SECONDS
        while True:
            prune_due = time.monotonic() >= prune_at
            if prune_due:
                prune_at = time.monotonic() + settings.KOALA_RETENTION_INTERVAL_SECONDS
            report = beat_tick(prune_due=prune_due, interval_seconds=interval, beat=beat)
            _log_tick(report)
            if options["once"]:
                if report.failed:
                    raise CommandError(f"beat tick: {', '.join(report.failed)} failed (the other steps ran)")
                break
            if stop.wait(interval):
                break

    def _status(self) -> None:
        health = beat_health()
        self.stdout.write(f"{'task':<12} {'last success':<21} {'last run':<21} failures  last error  beat")
        for task in health:
            row = task.row
            flag = "" if task.healthy else ("  STALE" if task.stale else "") + ("  FAILING" if task.failing else "")
            if not task.known:
                flag = "  (not a task of this installation)"
            failures = f"{row.consecutive_failures}/{row.failures}" if row else "-"
            error = f"{row.last_error} at {_when(row.last_failed_at)}" if row and row.last_error else "-"
            self.stdout.write(
                f"{task.name:<12} {_when(row.last_succeeded_at if row else None):<21} "
                f"{_when(row.last_finished_at if row else None):<21} {failures:<9} {error}  {row.beat if row else '-'}{flag}"
            )
        unhealthy = [task.name for task in health if not task.healthy]
        if unhealthy:
            raise CommandError(
                f"{', '.join(unhealthy)}: stale (no success within its limit) or failing; see journalctl -u koala-beat"
            )
