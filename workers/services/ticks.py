"""Timer-started housekeeping: ``koala_tick NAME`` runs one bounded task under a durable lease.

A run first takes the task's ``TickLease`` row with one conditional upsert (``sql.TICK_ACQUIRE``,
its row count decides): it refuses to start while a previous run holds an unexpired lease
(``PreviousRunActive``, exit ``EXIT_PREVIOUS_RUNNING``). A run that crashed (kill -9, OOM, a lost
host) never releases its lease; the lease expires ``lease_seconds`` after its last renewal and
the next run proceeds. The work calls ``lease.hold()`` before each bounded step: it renews the
lease and raises ``TickLeaseLost`` if another run took it meanwhile (this run stalled past its
expiry), so two runs never both work past a step. At exit the lease is released with the outcome.

The engine's tasks (``prune``, ``budget-report``) are registered in ``WorkersConfig.ready``; an
app adds its own with ``workers.hooks.register_tick_task`` (``exports``: ``export-cleanup``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from workers import hooks, sql

log = logging.getLogger("koala.tick")

# Exit codes, as systemd reads them (the units' SuccessExitStatus= lists EXIT_PREVIOUS_RUNNING:
# a run skipped because the previous one still works is not a failure to alert on).
EXIT_OK = 0
EXIT_FAILED = 1  # the task raised, or lost its lease mid-run
EXIT_USAGE = 2  # an unknown task or a bad option (argparse's own code)
EXIT_PREVIOUS_RUNNING = 75  # EX_TEMPFAIL: the previous run holds the lease; try again at the next timer

# koala_tick prune's pass: up to this many batches of KOALA_RETENTION_BATCH_SIZE (100,000 jobs at
# the default 1,000), each a short transaction; what is left waits for the next timer (or the beat).
PRUNE_TICK_BATCHES = 100


class TickLeaseLost(Exception):
    """Another run took this task's lease (it expired while this run stalled): stop working."""


class UnknownTickTask(LookupError):
    pass


@dataclass(frozen=True)
class PreviousRunActive(Exception):
    name: str
    owner: str
    acquired_at: datetime | None
    expires_at: datetime | None

    def __str__(self) -> str:
        since = f" since {self.acquired_at:%Y-%m-%d %H:%M:%S}Z" if self.acquired_at else ""
        until = f"; its lease expires at {self.expires_at:%Y-%m-%d %H:%M:%S}Z" if self.expires_at else ""
        return f"the previous run of {self.name} is still running ({self.owner}{since}{until})"


@dataclass(frozen=True)
class Previous:
    """The task's lease row as this run found it (owner "" when it never ran)."""

    owner: str = ""
    crashed: bool = False  # it expired without being released: that run died or stalled
    outcome: str = ""


class Lease:
    """A held task lease (``hooks.TickLease``): ``hold()`` is the fence."""

    def __init__(self, *, name: str, owner: str, token: str, seconds: float) -> None:
        self.name, self.owner, self.token, self.seconds = name, owner, token, seconds

    def hold(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql.TICK_HOLD, {"name": self.name, "token": self.token, "seconds": self.seconds})
            if cursor.rowcount != 1:
                raise TickLeaseLost(f"{self.name}: this run's lease expired and another run took it")

    def release(self, *, outcome: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(sql.TICK_RELEASE, {"name": self.name, "token": self.token, "outcome": outcome[:200]})


def task(name: str) -> hooks.TickTask:
    tasks = hooks.tick_tasks()
    if name not in tasks:
        raise UnknownTickTask(f"no tick task {name!r}; the tasks are: {', '.join(tasks) or 'none'}")
    return tasks[name]


def acquire(*, name: str, seconds: float, owner: str | None = None) -> tuple[Lease, Previous]:
    """Take the task's lease or raise PreviousRunActive (the row count of one upsert decides)."""
    owner = owner or f"{socket.gethostname()}:{os.getpid()}"
    token = secrets.token_hex(16)
    with connection.cursor() as cursor:
        cursor.execute(sql.TICK_ACQUIRE, {"name": name, "owner": owner, "token": token, "seconds": seconds})
        row = cursor.fetchone()
        if row is None:
            cursor.execute(sql.TICK_HOLDER, {"name": name})
            held = cursor.fetchone() or ("?", None, None)
            raise PreviousRunActive(name=name, owner=held[0], acquired_at=held[1], expires_at=held[2])
    prev_owner, prev_expires, prev_released, prev_outcome = row
    previous = Previous(
        owner=prev_owner or "",
        crashed=prev_owner is not None and prev_released is None and prev_expires is not None,
        outcome=prev_outcome or "",
    )
    return Lease(name=name, owner=owner, token=token, seconds=seconds), previous


@dataclass(frozen=True)
class TickRun:
    name: str
    previous: Previous
    result: Any


def run(*, name: str, lease_seconds: float | None = None) -> TickRun:
    """Run one task under its lease (module docstring). Raises UnknownTickTask, PreviousRunActive,
    TickLeaseLost or whatever the task raised; the lease is released in every case but the first two."""
    found = task(name)
    lease, previous = acquire(name=name, seconds=lease_seconds or found.lease_seconds)
    if previous.crashed:
        log.warning(
            "tick %s: the previous run (%s) never released its lease; it expired, this run proceeds", name, previous.owner
        )
    outcome = "failed"
    try:
        result = found.run(lease)
        lease.hold()  # the last check: a run that lost its lease while working says so
        outcome = "ok"
        return TickRun(name=name, previous=previous, result=result)
    except TickLeaseLost:
        outcome = "lease lost"
        raise
    except Exception as exc:
        outcome = f"failed: {type(exc).__name__}"
        raise
    finally:
        try:
            lease.release(outcome=outcome)
        except Exception as exc:  # it expires on its own; the run's own outcome matters more
            log.warning("tick %s: could not release its lease: %s: %s", name, type(exc).__name__, exc)


# -- the engine's own tick tasks ---------------------------------------------------------------------


def prune_tick(lease: hooks.TickLease) -> dict[str, int]:
    """One long pass of retention (PRUNE_TICK_BATCHES batches at most), fenced before each batch."""
    from workers.services import retention

    report = retention.prune(batches=PRUNE_TICK_BATCHES, before_batch=lease.hold)
    return {**report.loggable(), "batches": report.batches}


def budget_report_tick(lease: hooks.TickLease) -> dict[str, int]:
    """Yesterday's usage of every budget, each in its own zone, one log line per budget (a read)."""
    from workers.selectors.budgets import daily_report

    lines = daily_report(days_ago=1, before_each=lease.hold)
    for line in lines:
        log.info("budget-report: %s", line)
    return {"budgets": len(lines)}


def register_engine_tasks() -> None:
    hooks.register_tick_task(
        "prune",
        prune_tick,
        help=f"prune finished jobs past KOALA_RETENTION_DAYS: one pass of at most {PRUNE_TICK_BATCHES} batches",
        lease_seconds=300.0,
    )
    hooks.register_tick_task(
        "budget-report", budget_report_tick, help="log yesterday's usage of every budget, in its own zone", lease_seconds=120.0
    )
