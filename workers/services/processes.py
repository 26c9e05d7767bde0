"""Worker processes: the one writer of ``WorkerProcess`` rows, for RQ and HTTP workers alike.

A row is one worker name: who holds it (host, pid, and its *owner*: ``""`` for a process started
on a host of the deployment, an API key's prefix for an HTTP worker), what it serves, when it
started and was last seen, and how its latest incarnations ended. The dashboard tells a crash loop
from a stuck worker from these rows, so every kind of worker keeps them by the same rules:

- **A start** takes the row ``FOR UPDATE``: two processes starting under one name decide one after
  the other. If the row's holder recorded no exit it may still run:
  - another owner's holder (another API key's worker, an HTTP worker on a local worker's name or
    the reverse) is never displaced while its row says it runs: ``WorkerNameInUse`` — unless it is
    a local process on this very host whose pid is gone;
  - the same owner's holder is displaced once it is known gone: on this host its pid answers; an
    HTTP worker's earlier incarnation is taken as gone (its key is one trust domain and its new
    incarnation speaks for it); elsewhere only silence past ``WorkerProcess.silent_after_seconds``
    proves it. A displaced holder gets a ``died`` exit dated by its last sign of life.
  - the same process registering again (an HTTP worker whose registration the server forgot) is
    not a new start: nothing is added to its starts.
- **An exit** is recorded only by the row's own incarnation (same pid, still running): a later
  start that took the name over is never undone by a late exit of the one it displaced.
- **Presence** (``last_seen_at``) is written only for rows still running, and for a local worker
  only by its own pid (a process frozen while a successor took its name must not make the
  successor's row look alive).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from workers.models import WorkerExit, WorkerProcess

RECENT_STARTS_KEPT = 20
RECENT_EXITS_KEPT = 20


class WorkerNameInUse(Exception):
    """Another live process (or another key's worker) holds this worker name."""


def _exit_entry(at: datetime, exit: WorkerExit, pid: int, detail: str) -> dict[str, Any]:
    return {"at": at.isoformat(), "exit": str(exit), "pid": pid, "detail": detail}


def start(
    *,
    name: str,
    hostname: str,
    pid: int,
    queues: Sequence[str],
    kinds: Sequence[str],
    worker_class: str,
    owner: str = "",
    concurrency: int = 1,
    this_host: str | None = None,
    contracts: dict[str, str] | None = None,
) -> WorkerProcess:
    """Record that the process (``hostname``, ``pid``, ``owner``) now holds worker ``name``.

    ``this_host`` is the host this code runs on, where a pid can be checked (a local worker's own
    host); None for an HTTP worker's registration, whose process runs elsewhere. Raises
    WorkerNameInUse before writing anything when the name's holder may still run. ``contracts``:
    the digest of each served kind's contract as the starting process loaded it
    (``workers.kinds.contracts_of``). A start clears a stop the name's earlier incarnation asked for.
    """
    now = timezone.now()
    with transaction.atomic():
        row = WorkerProcess.objects.select_for_update().filter(name=name).first()
        starts = list(row.recent_starts) if row is not None else []
        exits = list(row.recent_exits) if row is not None else []
        running = row is not None and row.exit == WorkerExit.RUNNING and row.stopped_at is None
        # An HTTP worker registering again from the same process (the server forgot it, or it
        # re-registers after a 404). A local process never starts twice: its pid repeating (pid 1
        # in a container) is a new incarnation.
        again = running and bool(owner) and (row.hostname, row.pid, row.api_key) == (hostname, pid, owner)  # type: ignore[union-attr]
        if running and not again:
            assert row is not None
            if _may_run(row, owner=owner, this_host=this_host, now=now):
                holder = f"live pid {row.pid} on {row.hostname}" if not row.api_key else "an HTTP worker of another API key"
                raise WorkerNameInUse(f"worker name {name!r} is held by {holder}; choose another name or stop that worker")
            exits.append(_exit_entry(row.last_seen_at, WorkerExit.DIED, row.pid, "recorded no exit"))
        if not again:
            starts = [*starts, now.isoformat()][-RECENT_STARTS_KEPT:]
        WorkerProcess.objects.update_or_create(
            name=name,
            defaults={
                "hostname": hostname[:255],
                "pid": pid,
                "queues": list(queues),
                "kinds": sorted(set(kinds)),
                "worker_class": worker_class[:100],
                "started_at": row.started_at if again and row is not None else now,
                "last_seen_at": now,
                "stopped_at": None,
                "recent_starts": starts,
                "exit": WorkerExit.RUNNING,
                "recent_exits": exits[-RECENT_EXITS_KEPT:],
                "concurrency": concurrency,
                "api_key": owner,
                "stop_requested_at": None,
                "contracts": dict(contracts or {}),
            },
        )
        return WorkerProcess.objects.get(name=name)


def _may_run(row: WorkerProcess, *, owner: str, this_host: str | None, now: datetime) -> bool:
    """Whether the holder of a row that recorded no exit may still run, as the start by ``owner`` sees it."""
    if this_host is not None and not row.api_key and row.hostname == this_host:
        return pid_alive(row.pid)  # a local process on this very host: its pid answers
    if row.api_key != owner:
        return True  # another owner's: only its own exit (or a person) frees the name
    if owner:
        return False  # the same key's earlier HTTP worker: its new incarnation speaks for it
    return (now - row.last_seen_at).total_seconds() <= WorkerProcess.silent_after_seconds()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host runs (RQ's own rule for a name's Redis key, too)."""
    if pid == os.getpid():
        return False  # our own pid, held by an earlier incarnation (pids repeat in containers)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def finish(*, name: str, pid: int, exit: WorkerExit, detail: str, owner: str | None = None) -> bool:
    """Record how the incarnation ``pid`` of worker ``name`` ended; False if the row is no longer
    its own (a later start took the name over) or already records an exit."""
    now = timezone.now()
    with transaction.atomic():
        rows = WorkerProcess.objects.select_for_update().filter(name=name, pid=pid, exit=WorkerExit.RUNNING)
        if owner is not None:
            rows = rows.filter(api_key=owner)
        row = rows.first()
        if row is None:
            return False
        row.exit = exit
        row.stopped_at = row.last_seen_at = now
        row.recent_exits = [*row.recent_exits, _exit_entry(now, exit, row.pid, detail)][-RECENT_EXITS_KEPT:]
        row.save(update_fields=["exit", "stopped_at", "last_seen_at", "recent_exits"])
    return True


def request_stop(*, name: str, owner: str) -> bool:
    """An HTTP worker of key ``owner`` asked to stop while it holds leases: from now on no claim in
    any server process gives it another (the claim reads the column). False if no running row."""
    return bool(
        WorkerProcess.objects.filter(name=name, api_key=owner, stopped_at__isnull=True, stop_requested_at__isnull=True).update(
            stop_requested_at=timezone.now()
        )
    )


def touch(*, names: Sequence[str], pid: int | None = None) -> int:
    """Mark workers ``names`` seen now (one UPDATE); ``pid``: only the incarnation with that pid."""
    if not names:
        return 0
    rows = WorkerProcess.objects.filter(name__in=list(names), stopped_at__isnull=True)
    if pid is not None:
        rows = rows.filter(pid=pid)
    return rows.update(last_seen_at=timezone.now())
