"""Worker processes as an operator reads them: each one's health (healthy, idle, stuck,
crash-looping, lost, crashed, stopped), decided from its row, its attempts and the due work.
Reads only. The dashboard, ``koala_status`` and the metrics endpoint all judge workers here.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.expressions import RawSQL

from workers import sql
from workers.models import ABNORMAL_EXITS, Attempt, Operation, Pause, Scope, WorkerExit, WorkerProcess
from workers.services.pauses import active_pauses

DAY = dt.timedelta(hours=24)

# Every state worker_health can give, in the order the pages list them.
WORKER_STATES = ("healthy", "idle", "stuck", "crash_looping", "lost", "crashed", "stopped")


@dataclass
class WorkerHealth:
    name: str
    hostname: str
    queues: list[str]
    status: str  # healthy | idle | stuck | crash_looping | lost | crashed | stopped
    why: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    live_job_id: int | None = None
    last_completed: Attempt | None = None
    last_operation: Operation | None = None


def oldest_due(*, now: dt.datetime) -> dict[str, dt.datetime]:
    """The scheduled_at of each queue's oldest due job: one probe of job_queued_due_idx per queue."""
    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_OLDEST_DUE, {"now": now})
        return dict(cursor.fetchall())


def queue_pauses(pauses: Iterable[Pause], queues: Iterable[str]) -> dict[str, Pause]:
    """The live pause holding each queue back: a global one, else the queue's own (kind pauses
    hold some jobs of a queue, not the queue)."""
    # A tenant's pause holds some of a queue's jobs, not the queue: it shows in the banner only.
    pauses = [p for p in pauses if not p.tenant]
    everything = next((p for p in pauses if p.scope == Scope.GLOBAL), None)
    own = {p.target: p for p in pauses if p.scope == Scope.QUEUE}
    held = {queue: everything or own.get(queue) for queue in queues}
    return {queue: pause for queue, pause in held.items() if pause is not None}


def worker_health(
    *, now: dt.datetime, due: dict[str, int] | None = None, pauses: list[Pause] | None = None
) -> list[WorkerHealth]:
    """Tell a crash loop from a stuck worker (R3): a live process can be stuck.

    - crash_looping: KOALA_CRASH_LOOP_STARTS or more abnormal exits of one host and queue set
      within KOALA_CRASH_LOOP_WINDOW_SECONDS. Abnormal: a process that left on an unhandled
      error (it recorded ``crashed``), one that recorded no exit and was found dead by the
      next start under its name (``died``), or one still silent past a lease (``lost``, not
      yet restarted). Clean stops (SIGTERM, Ctrl-C, --burst) never count, however many;
    - lost: not stopped, but silent for longer than a lease (killed, host gone);
    - crashed: left its loop on an unhandled error (once; a loop of them is crash_looping);
    - stuck: alive, yet for KOALA_STUCK_AFTER_SECONDS it has held one attempt, or it had due
      work in its (unpaused) queues and neither started nor finished anything;
    - idle: alive with nothing due, or with due work only in paused queues (it says which, and
      how much waits there: ``due``, due jobs per queue, when the caller has counted them);
      healthy: alive and working; stopped: stopped cleanly.
    """
    alive_within = dt.timedelta(seconds=WorkerProcess.silent_after_seconds())
    stuck_after = dt.timedelta(seconds=float(settings.KOALA_STUCK_AFTER_SECONDS))
    window = dt.timedelta(seconds=float(settings.KOALA_CRASH_LOOP_WINDOW_SECONDS))
    processes = list(
        WorkerProcess.objects.filter(
            Q(stopped_at__isnull=True, last_seen_at__gte=now - DAY)
            | Q(started_at__gte=now - window)
            | Q(stopped_at__gte=now - window)
        ).order_by("hostname", "-started_at")[:200]
    )
    if not processes:
        return []
    names = [p.name for p in processes]

    abnormal: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    for process in processes:
        # A fixed-name worker restarted by its service manager keeps one row with its exits.
        times = [dt.datetime.fromisoformat(e["at"]) for e in process.recent_exits if e.get("exit") in ABNORMAL_EXITS]
        if process.exit == WorkerExit.RUNNING and now - process.last_seen_at > alive_within:
            times.append(process.last_seen_at)  # silent, not restarted yet: a death nobody recorded
        abnormal[(process.hostname, tuple(process.queues))] += sum(1 for t in times if t >= now - window)

    # Each worker's live attempt (a process runs one at a time): one probe per worker.
    with connection.cursor() as cursor:
        cursor.execute(sql.DASHBOARD_LIVE_ATTEMPTS, [names])
        live: dict[str, tuple[int, dt.datetime]] = {worker: (job_id, started) for worker, job_id, started in cursor.fetchall()}
    # The newest finished attempt of each worker: one index descent per worker.
    last_ids = RawSQL(sql.DASHBOARD_LAST_FINISHED_ATTEMPTS, [names, now - DAY])  # noqa: S611 (a workers.sql statement; values are bound)
    last_done = {
        a.worker_id: a
        for a in Attempt.objects.filter(id__in=last_ids)
        .select_related("job")
        .only("worker_id", "finished_at", "started_at", "outcome", "job__id", "job__kind")
    }
    # The newest settled operation of each worker: per worker, top 1 over its attempts' operations.
    op_ids = RawSQL(sql.DASHBOARD_LAST_SETTLED_OPERATIONS, [names, now - DAY])  # noqa: S611 (a workers.sql statement; values are bound)
    last_op = {
        op.attempt.worker_id: op  # type: ignore[union-attr]  # joined on the attempt: never None
        for op in Operation.objects.filter(id__in=op_ids)
        .select_related("attempt")
        .only("id", "name", "kind", "state", "settled_at", "job_id", "attempt__worker_id")
    }
    # Queues whose oldest due job has waited longer than stuck_after (one probe per queue).
    waiting = oldest_due(now=now)
    due_queues = {queue for queue, due_at in waiting.items() if due_at <= now - stuck_after}
    # Work held back by a pause is not a stuck worker's fault.
    held = queue_pauses(active_pauses() if pauses is None else pauses, waiting)
    due_queues -= set(held)

    result = []
    for process in processes:
        done = last_done.get(process.name)
        live_job_id, started_live = live.get(process.name, (None, None))
        last_activity = max([t for t in (process.started_at, done.finished_at if done else None, started_live) if t is not None])
        exits = abnormal.get((process.hostname, tuple(process.queues)), 0)
        if exits >= int(settings.KOALA_CRASH_LOOP_STARTS):
            status, why = (
                "crash_looping",
                f"{exits} abnormal exits on {process.hostname} within {window.total_seconds():.0f} s",
            )
        elif process.exit == WorkerExit.CRASHED:
            detail = process.recent_exits[-1].get("detail", "") if process.recent_exits else ""
            status, why = "crashed", f"exited on {detail or 'an error'} at {process.stopped_at or process.last_seen_at:%H:%M:%S}"
        elif process.stopped_at is not None:
            status, why = "stopped", f"stopped at {process.stopped_at:%H:%M:%S}"
        elif now - process.last_seen_at > alive_within:
            status, why = "lost", f"no sign of life for {(now - process.last_seen_at).total_seconds():.0f} s"
        elif started_live is not None and now - started_live > stuck_after:
            status, why = "stuck", f"one attempt running for {(now - started_live).total_seconds():.0f} s"
        elif started_live is None and due_queues & set(process.queues) and now - last_activity > stuck_after:
            status, why = (
                "stuck",
                f"due work waiting, nothing started or finished for {(now - last_activity).total_seconds():.0f} s",
            )
        elif started_live is not None:
            status, why = "healthy", "running a job"
        elif paused_here := [q for q in process.queues if q in held]:
            # Due work waits, but a pause holds it: idle by order, not for want of work.
            status, why = "idle", "; ".join(_held_back(queue, held[queue], due) for queue in paused_here)
        else:
            status, why = "idle", "alive, nothing due"
        result.append(
            WorkerHealth(
                name=process.name,
                hostname=process.hostname,
                queues=list(process.queues),
                status=status,
                why=why,
                started_at=process.started_at,
                last_seen_at=process.last_seen_at,
                live_job_id=live_job_id,
                last_completed=done,
                last_operation=last_op.get(process.name),
            )
        )
    return result


def _held_back(queue: str, pause: Pause, due: dict[str, int] | None) -> str:
    count = f"{due[queue]:,} due" if due and queue in due else "due work"
    if pause.scope == Scope.GLOBAL:
        return f"everything paused ({pause.mode}): {count} waiting in {queue}"
    return f"queue {queue} paused ({pause.mode}): {count} waiting"


@dataclass(frozen=True)
class ContractMismatch:
    """Live workers serve ``kind`` (name@version) under different contracts: their processes
    loaded different kind modules. ``hosts``: each digest with the workers ("name on host") that
    registered it, the most common first."""

    kind: str
    hosts: list[tuple[str, list[str]]]

    @property
    def text(self) -> str:
        return f"{self.kind} differs between hosts: " + "; ".join(
            f"{digest}: {', '.join(workers)}" for digest, workers in self.hosts
        )


def contract_mismatches(*, now: dt.datetime) -> list[ContractMismatch]:
    """Every kind@version that live workers (not stopped, seen within a lease) serve under more
    than one contract digest (``WorkerProcess.contracts``, written at each start from the kinds
    the process loaded: workers.kinds.JobKind.contract_digest). A row from before the digests
    were recorded (empty ``contracts``) is left out rather than guessed at."""
    alive_within = dt.timedelta(seconds=WorkerProcess.silent_after_seconds())
    rows = WorkerProcess.objects.filter(stopped_at__isnull=True, last_seen_at__gte=now - alive_within).order_by("name")
    seen: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for row in rows.only("name", "hostname", "contracts")[:1000]:
        for kind, digest in (row.contracts or {}).items():
            seen[kind][str(digest)].append(f"{row.name} on {row.hostname}")
    return [
        ContractMismatch(kind=kind, hosts=sorted(((d, w) for d, w in digests.items()), key=lambda item: (-len(item[1]), item[0])))
        for kind, digests in sorted(seen.items())
        if len(digests) > 1
    ]
