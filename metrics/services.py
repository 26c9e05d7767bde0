"""The metrics app's writes: the fold that moves finished rows into the tallies (a beat task), the
retention hook that folds a pruned job's rows before they go, and the rejection counter.

Why a fold at all: a counter Prometheus can ``rate()`` must never go down, yet retention deletes
the attempts and jobs it was counted from, and a process's memory dies with it. So counts live in
PostgreSQL (metrics.models): the tallies hold everything finished before the fold mark, the
scrape adds what finished since (metrics.selectors), and the mark and the tallies move together
in one transaction. Two folds never count a row twice: the mark's row is locked for the fold
(``FOR UPDATE SKIP LOCKED``: a second beat replica skips, it would fold nothing new).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from metrics.models import FoldMark, RejectionEvent, RejectionTally
from workers import sql

log = logging.getLogger(__name__)

MARK = "engine"
# Ends stamped by the application's clock (a cancel, an operator's requeue) may trail the
# database's by this much; the fold stays this far behind the oldest open transaction.
HORIZON_MARGIN_SECONDS = 5.0
# Rejection events folded per fold at most (the rest wait for the next): a fold stays short.
FOLD_EVENTS = 10_000
# The histogram's upper bounds (seconds): from a quick call to the four hours a long export may take.
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0,
)  # fmt: skip


@dataclass(frozen=True)
class Folded:
    """What one fold did (the beat logs it)."""

    folded: bool  # False: another fold held the mark
    upto: dt.datetime | None = None
    completions: int = 0  # tally rows touched
    rejections: int = 0  # rejections folded

    def __str__(self) -> str:
        if not self.folded:
            return "skipped (another fold holds the mark)"
        return f"upto={self.upto:%Y-%m-%dT%H:%M:%S} completion_rows={self.completions} rejections={self.rejections}"


def fold(*, until: dt.datetime | None = None) -> Folded:
    """Move every attempt and job that finished between the mark and the horizon (or ``until``, if
    earlier) into the tallies, and the rejection events into theirs; the mark moves there. One
    transaction."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql.METRICS_MARK_CREATE, {"name": MARK})
        # Locked for this fold; a second beat's fold skips it (it would only fold the same window).
        mark = FoldMark.objects.select_for_update(skip_locked=True).filter(name=MARK).first()
        if mark is None:
            return Folded(folded=False)
        start = mark.folded_before
        cursor.execute(sql.METRICS_FOLD_HORIZON, {"margin": HORIZON_MARGIN_SECONDS})
        (upto,) = cursor.fetchone()
        if until is not None:
            upto = min(upto, until)
        if upto <= start:
            return Folded(folded=True, upto=start, rejections=_fold_rejections())
        window = {"from": start, "upto": upto, "bounds": list(BUCKETS)}
        cursor.execute(sql.METRICS_FOLD_COMPLETIONS, window)
        completions = cursor.rowcount
        cursor.execute(sql.METRICS_FOLD_DURATIONS, window)
        cursor.execute(sql.METRICS_FOLD_FAILURES, window)
        cursor.execute(sql.METRICS_FOLD_KEPT, window)
        FoldMark.objects.filter(name=MARK).update(folded_before=upto, folded_at=timezone.now())
        return Folded(folded=True, upto=upto, completions=completions, rejections=_fold_rejections())


def fold_pruned(job_ids: Sequence[int]) -> int:
    """The retention hook (``forget``), inside the prune batch's transaction before the jobs go:
    their attempts and failures not folded yet are added to the tallies now, and the kept-jobs
    tally loses the ones it had. Waits for a running fold (the mark's lock), so the two never
    both count a row. Returns the tally rows touched."""
    with connection.cursor() as cursor:
        cursor.execute(sql.METRICS_MARK_CREATE, {"name": MARK})
        start = FoldMark.objects.select_for_update().get(name=MARK).folded_before  # waits for a running fold
        params: dict[str, Any] = {"ids": list(job_ids), "from": start, "bounds": list(BUCKETS)}
        cursor.execute(sql.METRICS_PRUNED_COMPLETIONS, params)
        touched = max(cursor.rowcount, 0)
        cursor.execute(sql.METRICS_PRUNED_DURATIONS, params)
        touched += max(cursor.rowcount, 0)
        cursor.execute(sql.METRICS_PRUNED_FAILURES, params)
        touched += max(cursor.rowcount, 0)
        cursor.execute(sql.METRICS_PRUNED_KEPT, params)
        touched += max(cursor.rowcount, 0)
        return touched


def _fold_rejections() -> int:
    """The rejection events so far, summed into their tallies and deleted (inside the fold). By the
    rows read, not an id range: an event whose insert commits later is folded by a later fold."""
    events = list(RejectionEvent.objects.order_by("id").values_list("id", "reason", "count")[:FOLD_EVENTS])
    if not events:
        return 0
    sums: Counter[str] = Counter()
    for _id, reason, n in events:
        sums[reason] += n
    for reason, n in sums.items():
        if not RejectionTally.objects.filter(reason=reason).update(count=F("count") + n):
            RejectionTally.objects.create(reason=reason, count=n)
    RejectionEvent.objects.filter(id__in=[event_id for event_id, _r, _n in events]).delete()
    return sum(sums.values())


# -- the rejection counter (workers.hooks.register_rejection_counter) ---------------------------------

# A reason is a label: a closed set of names in code, never free text. Anything else is "other".
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_pending: Counter[str] = Counter()
_pending_lock = threading.Lock()


def bounded_reason(reason: str) -> str:
    return reason if _REASON.match(reason) else "other"


def count_rejection(reason: str) -> None:
    """Count one named refusal. Cheap: it adds to this process's batch, written at once when the
    caller is outside a transaction (an insert, no row anyone else writes), else after its commit;
    a batch met inside a transaction that rolls back, or in async code, waits for the next write.
    A database error keeps the batch; it never reaches the engine."""
    with _pending_lock:
        _pending[bounded_reason(reason)] += 1
    try:
        asyncio.get_running_loop()
        return  # async code may not touch the database: the next sync count writes it
    except RuntimeError:
        pass
    if connection.in_atomic_block:
        transaction.on_commit(flush_rejections)
    else:
        flush_rejections()


def flush_rejections() -> int:
    """Write this process's pending rejections (one insert); the count written."""
    with _pending_lock:
        batch = dict(_pending)
        _pending.clear()
    if not batch:
        return 0
    try:
        RejectionEvent.objects.bulk_create([RejectionEvent(reason=reason, count=n) for reason, n in batch.items()])
    except DatabaseError:
        log.warning("metrics: could not write %d rejection counts; kept for the next write", sum(batch.values()))
        with _pending_lock:
            _pending.update(batch)
        return 0
    return sum(batch.values())
