"""``koala_status``'s checks: one verdict per thing an operator is paged for (R3, R7).

Each check reads what the dashboard reads (the engine's worker, budget and beat selectors,
the review queue) and judges it against the KOALA_STATUS_* thresholds: ``ok``,
``warning`` or ``critical``. It is here, in the console's layer, because it reads the reviews
app, which sits above the engine. Reads only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import IntEnum

from django.conf import settings
from django.db.models import Min
from django.utils import timezone

from reviews.models import ReviewRequest, ReviewState
from workers.models import Attempt, Outcome, PauseSource
from workers.selectors.beat import beat_health
from workers.selectors.budgets import budget_bars
from workers.selectors.workers import contract_mismatches, oldest_due, queue_pauses, worker_health
from workers.services.pauses import active_pauses


class Level(IntEnum):
    """Also the command's exit status: the worst level found."""

    OK = 0
    WARNING = 1
    CRITICAL = 2


@dataclass(frozen=True)
class Check:
    name: str  # e.g. "due_age:default", "workers", "budget:daily"
    level: Level
    detail: str


def _age(seconds: float) -> str:
    return f"{seconds:.0f}s"


def _by_age(seconds: float, warning: float, critical: float) -> Level:
    if seconds >= critical:
        return Level.CRITICAL
    return Level.WARNING if seconds >= warning else Level.OK


def due_age(*, now: dt.datetime) -> list[Check]:
    """The oldest due job's wait per queue that has due work; a paused queue's wait is by order."""
    waiting = oldest_due(now=now)
    held = queue_pauses(active_pauses(), waiting)
    checks = []
    for queue, due_at in sorted(waiting.items()):
        age = max((now - due_at).total_seconds(), 0.0)
        if queue in held:
            checks.append(Check(f"due_age:{queue}", Level.OK, f"oldest due job waited {_age(age)} (queue paused)"))
            continue
        level = _by_age(age, settings.KOALA_STATUS_DUE_AGE_WARNING_SECONDS, settings.KOALA_STATUS_DUE_AGE_CRITICAL_SECONDS)
        checks.append(Check(f"due_age:{queue}", level, f"oldest due job waited {_age(age)}"))
    if not checks:
        checks.append(Check("due_age", Level.OK, "nothing due"))
    return checks


def last_completion(*, now: dt.datetime, work_due: bool) -> Check:
    """Time since the last succeeded attempt; judged only while work is due (quiet is not broken)."""
    finished = (
        Attempt.objects.filter(finished_at__isnull=False, outcome=Outcome.SUCCEEDED)
        .order_by("-finished_at")
        .values_list("finished_at", flat=True)
        .first()
    )
    if finished is None:
        detail = "no succeeded attempt on record"
        level = Level.WARNING if work_due else Level.OK
        return Check("last_completion", level, detail + ("" if work_due else ", nothing due"))
    age = max((now - finished).total_seconds(), 0.0)
    level = Level.OK
    if work_due:
        level = _by_age(
            age,
            settings.KOALA_STATUS_NO_COMPLETION_WARNING_SECONDS,
            settings.KOALA_STATUS_NO_COMPLETION_CRITICAL_SECONDS,
        )
    return Check("last_completion", level, f"last succeeded attempt {_age(age)} ago" + ("" if work_due else ", nothing due"))


def workers(*, now: dt.datetime) -> Check:
    """Crash-looping or stuck workers are critical; lost or crashed (once) ones a warning."""
    health = worker_health(now=now)
    by_status: dict[str, list[str]] = {}
    for worker in health:
        by_status.setdefault(worker.status, []).append(worker.name)
    bad = {status: names for status, names in by_status.items() if status in ("crash_looping", "stuck")}
    odd = {status: names for status, names in by_status.items() if status in ("lost", "crashed")}
    counts = ", ".join(f"{len(names)} {status}" for status, names in sorted(by_status.items())) or "no worker on record"
    named = "; ".join(f"{status}: {' '.join(names[:5])}" for status, names in sorted({**bad, **odd}.items()))
    level = Level.CRITICAL if bad else Level.WARNING if odd else Level.OK
    return Check("workers", level, counts + (f" ({named})" if named else ""))


def contracts(*, now: dt.datetime) -> Check:
    """A kind@version that live workers serve under different contracts (hosts that loaded
    different kind modules) is a warning naming the kind and the hosts."""
    found = contract_mismatches(now=now)
    if not found:
        return Check("contracts", Level.OK, "every kind has one contract across the live workers")
    return Check("contracts", Level.WARNING, " | ".join(m.text for m in found[:5]))


def breakers() -> Check:
    tripped = [p for p in active_pauses() if p.source == PauseSource.CIRCUIT_BREAKER]
    if not tripped:
        return Check("breaker", Level.OK, "no breaker tripped")
    names = " ".join(f"{p.scope}:{p.target}" for p in tripped[:5])
    return Check("breaker", Level.WARNING, f"{len(tripped)} tripped ({names})")


def budgets(*, now: dt.datetime) -> list[Check]:
    """Each budget with a limit at or past KOALA_STATUS_BUDGET_WARNING_FRACTION (warning) or
    exhausted (critical), today in the budget's own zone; one summary line when none is."""
    fraction = settings.KOALA_STATUS_BUDGET_WARNING_FRACTION
    checks = []
    bars = budget_bars(now=now)
    for bar in bars:
        worst, words = Level.OK, []
        for what, used, limit in bar.rows:
            if limit is None or limit <= 0:
                continue
            share = used / limit
            if share >= 1:
                worst = max(worst, Level.CRITICAL)
                words.append(f"{what} exhausted ({used}/{limit})")
            elif share >= fraction:
                worst = max(worst, Level.WARNING)
                words.append(f"{what} at {share:.0%} ({used}/{limit})")
        if worst:
            checks.append(Check(f"budget:{bar.budget.name}", worst, ", ".join(words)))
    if not checks:
        checks.append(Check("budgets", Level.OK, f"{len(bars)} under {fraction:.0%} of their limits"))
    return checks


def beat(*, now: dt.datetime) -> Check:
    """Stale steps (the beat is not ticking) are critical; a step failing while others tick, a warning."""
    health = [task for task in beat_health(now=now) if task.known]
    stale = [task.name for task in health if task.stale]
    failing = [task.name for task in health if task.failing and not task.stale]
    if stale:
        return Check("beat", Level.CRITICAL, f"not ticking: {' '.join(stale)} stale (koala_beat --status)")
    if failing:
        return Check("beat", Level.WARNING, f"failing: {' '.join(failing)} (koala_beat --status)")
    return Check("beat", Level.OK, f"{len(health)} steps ticking")


def reviews(*, now: dt.datetime) -> Check:
    pending = ReviewRequest.objects.filter(state=ReviewState.PENDING)
    found = pending.aggregate(oldest=Min("created_at"))
    count = pending.count() if found["oldest"] is not None else 0
    if not count:
        return Check("reviews", Level.OK, "none pending")
    age = max((now - found["oldest"]).total_seconds(), 0.0)
    level = _by_age(age, settings.KOALA_STATUS_REVIEW_AGE_WARNING_SECONDS, settings.KOALA_STATUS_REVIEW_AGE_CRITICAL_SECONDS)
    return Check("reviews", level, f"{count} pending, oldest waited {_age(age)}")


def status_checks(*, now: dt.datetime | None = None) -> list[Check]:
    now = now or timezone.now()
    due = due_age(now=now)
    work_due = any(check.name.startswith("due_age:") for check in due)
    return [
        *due,
        last_completion(now=now, work_due=work_due),
        workers(now=now),
        contracts(now=now),
        breakers(),
        *budgets(now=now),
        beat(now=now),
        reviews(now=now),
    ]
