"""What retention would prune now (``koala_prune --dry-run``): counts only, nothing changes."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from workers import sql
from workers.services.retention import PrunePlan


@dataclass(frozen=True)
class PrunableCounts:
    jobs: int  # by the engine's rules, before the apps keep some (a live run, an unsettled export)
    attempts: int
    kept_by_operations: int  # finished jobs past the window that an open operation keeps


def prunable(*, decided: PrunePlan) -> PrunableCounts:
    with connection.cursor() as cursor:
        cursor.execute(sql.COUNT_PRUNABLE, {"cutoff": decided.cutoff})
        jobs, attempts = cursor.fetchone()
        cursor.execute(sql.COUNT_PINNED_BY_OPERATIONS, {"cutoff": decided.cutoff})
        (pinned,) = cursor.fetchone()
    return PrunableCounts(jobs=jobs, attempts=int(attempts), kept_by_operations=pinned)
