from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers import hooks
from workers.dbsession import bound_sessions
from workers.selectors.beat import tick_states
from workers.services import ticks


def _task_name(value: str) -> str:
    """A registered tick task (argparse's one-line error and exit 2 otherwise, before anything runs)."""
    if value not in hooks.tick_tasks():
        raise argparse.ArgumentTypeError(
            str(
                ticks.UnknownTickTask(
                    f"no tick task {cli.shown(value)}; the tasks are: {', '.join(hooks.tick_tasks()) or 'none'}"
                )
            )
        )
    return value


def _loggable(result: Any) -> str:
    if isinstance(result, Mapping):
        return " ".join(f"{key}={value}" for key, value in result.items())
    return str(result)


class Command(BaseCommand):
    help = (
        "Run one bounded housekeeping task under a durable lease (the systemd timers' oneshot services start it): "
        "prune, budget-report, and the installed apps' tasks (export-cleanup). It refuses to start while the "
        "previous run of the task holds an unexpired lease; a crashed run's lease expires and the next run proceeds. "
        f"Exit codes: {ticks.EXIT_OK} done, {ticks.EXIT_FAILED} the task failed or lost its lease, {ticks.EXIT_USAGE} "
        f"unknown task or bad option, {ticks.EXIT_PREVIOUS_RUNNING} skipped: the previous run still holds the lease. "
        "--list prints the tasks and their leases."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", nargs="?", type=_task_name, help="the task to run (see --list)")
        parser.add_argument("--list", action="store_true", help="print the tasks, their leases and last outcomes, and exit")
        parser.add_argument(
            "--lease-seconds",
            type=cli.finite_float(1.0, 86400.0),
            default=None,
            help="how long the lease lasts between two checks of the work, 1-86400 (default: the task's own)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["list"]:
            self._list()
            return
        name = options["task"]
        if name is None:
            raise CommandError("name a task: koala_tick TASK (koala_tick --list shows them)", returncode=ticks.EXIT_USAGE)
        # Unattended: no statement of the run waits long on a lock or runs away (workers.dbsession).
        bound_sessions()
        try:
            done = ticks.run(name=name, lease_seconds=options["lease_seconds"])
        except ticks.PreviousRunActive as refused:
            self.stderr.write(f"koala_tick {name}: skipped: {refused}")
            sys.exit(ticks.EXIT_PREVIOUS_RUNNING)
        except ticks.TickLeaseLost as lost:
            self.stderr.write(f"koala_tick {name}: stopped: {lost}")
            sys.exit(ticks.EXIT_FAILED)
        except Exception as exc:
            self.stderr.write(f"koala_tick {name}: failed: {type(exc).__name__}: {exc}")
            sys.exit(ticks.EXIT_FAILED)
        crashed = f" (the previous run, {done.previous.owner}, had crashed: its lease expired)" if done.previous.crashed else ""
        self.stdout.write(f"tick {name}: {_loggable(done.result)}{crashed}")

    def _list(self) -> None:
        for state in tick_states():
            lease = state.lease
            if lease is None:
                said = "never ran"
            elif state.running:
                since = f"{lease.acquired_at:%Y-%m-%d %H:%M:%S}Z"
                said = f"RUNNING: {lease.owner} since {since}, lease until {lease.expires_at:%H:%M:%S}Z"
            elif lease.released_at is None:
                said = f"last run by {lease.owner} crashed (its lease expired unreleased)"
            else:
                said = f"last run by {lease.owner} ended {lease.released_at:%Y-%m-%d %H:%M:%S}Z: {lease.last_outcome}"
            self.stdout.write(f"{state.name:<15} {said}\n{'':<15} {state.help}")
