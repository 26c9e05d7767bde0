"""Budgets as a daily report reads them (``koala_tick budget-report``). Reads only."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from workers.models import Budget
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
