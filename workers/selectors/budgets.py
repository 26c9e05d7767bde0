"""Budgets as people read them: today's usage against the limits (the dashboard, the budgets page,
``koala_status``, the metrics endpoint) and the daily report (``koala_tick budget-report``). Reads only."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from zoneinfo import ZoneInfo

from django.db import connection
from django.db.models import Q

from workers import sql
from workers.models import Budget, BudgetUsage
from workers.services.budgets import period_for, usage_for

# A report names every budget; past this many it says how many it left out (the work is bounded).
REPORT_BUDGETS = 1000


def daily_report(*, days_ago: int = 1, before_each: Callable[[], None] | None = None) -> list[str]:
    """One line per budget: its usage on the day ``days_ago`` before today in the budget's zone."""
    budgets = list(Budget.objects.order_by("name")[: REPORT_BUDGETS + 1])
    lines = []
    for index, budget in enumerate(budgets[:REPORT_BUDGETS]):
        if before_each is not None and index % 100 == 0:
            before_each()
        day = period_for(budget) - timedelta(days=days_ago)
        usage = usage_for(budget=budget, on=day)
        lines.append(
            f"{budget.name} {day} ({budget.timezone}): spent {usage.spent_minor} reserved {usage.reserved_minor} "
            f"{budget.currency}, requests {usage.requests}, attempts {usage.attempts}, run {usage.run_seconds:.0f}s"
        )
    if len(budgets) > REPORT_BUDGETS:
        lines.append(f"… and more budgets past the first {REPORT_BUDGETS} (koala_budget list shows them all)")
    return lines


@dataclass
class BudgetBar:
    budget: Budget
    period: dt.date
    usage: BudgetUsage | None
    rows: list[tuple[str, int | float, int | None]]  # (what, used, limit)


def local_day(budget: Budget, now: dt.datetime) -> dt.date:
    try:
        zone = ZoneInfo(budget.timezone)
    except (KeyError, ValueError):
        zone = ZoneInfo("UTC")
    return now.astimezone(zone).date()


def budget_bars(*, now: dt.datetime, only: Budget | None = None) -> list[BudgetBar]:
    """Today's usage of every budget (its own time zone's day) against its limits: two queries."""
    budgets = [only] if only is not None else list(Budget.objects.all()[:100])
    if not budgets:
        return []
    periods = {b.pk: local_day(b, now) for b in budgets}
    wanted = Q()
    for budget_id, period in periods.items():
        wanted |= Q(budget_id=budget_id, period=period)
    usage = {u.budget_id: u for u in BudgetUsage.objects.filter(wanted)}
    bars = []
    for budget in budgets:
        used = usage.get(budget.pk)
        rows: list[tuple[str, int | float, int | None]] = [
            ("spend", (used.spent_minor + used.reserved_minor) if used else 0, budget.spend_limit_minor),
            ("requests", used.requests if used else 0, budget.request_limit),
            ("attempts", used.attempts if used else 0, budget.attempt_limit),
            ("run seconds", round(used.run_seconds, 1) if used else 0, budget.run_seconds_limit),
        ]
        bars.append(BudgetBar(budget=budget, period=periods[budget.pk], usage=used, rows=rows))
    return bars


def running_in_scope(budget: Budget) -> int:
    """Running jobs in the budget's scope (and tenant): what its concurrency limit is held against."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.COUNT_RUNNING_IN_SCOPE[(budget.scope, bool(budget.tenant))], {"target": budget.target, "tenant": budget.tenant}
        )
        (running,) = cursor.fetchone()
    return int(running)
