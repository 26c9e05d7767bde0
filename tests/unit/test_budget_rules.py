"""Budget rules that need no database: the period a moment falls in, what a parked job records,
the price of tokens, and the refusals of a malformed budget before anything is written."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

import pytest

from workers import sql
from workers.errors import SafetyError
from workers.models import Budget, ModelPrice
from workers.services.budgets import BudgetExhausted, create_budget, period_for, price_tokens, update_budget


@pytest.mark.parametrize(
    ("zone", "moment", "period"),
    [
        ("UTC", datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC), date(2026, 3, 1)),
        ("UTC", datetime(2026, 3, 2, 0, 0, tzinfo=UTC), date(2026, 3, 2)),
        ("Pacific/Auckland", datetime(2026, 3, 1, 10, 59, tzinfo=UTC), date(2026, 3, 1)),  # 23:59 NZDT
        ("Pacific/Auckland", datetime(2026, 3, 1, 11, 0, tzinfo=UTC), date(2026, 3, 2)),  # midnight there
        ("America/Los_Angeles", datetime(2026, 3, 2, 7, 59, tzinfo=UTC), date(2026, 3, 1)),  # 23:59 PST
        ("America/Los_Angeles", datetime(2026, 3, 2, 8, 0, tzinfo=UTC), date(2026, 3, 2)),
        # The night summer time starts in Paris (02:00 becomes 03:00): the day still ends at midnight.
        ("Europe/Paris", datetime(2026, 3, 29, 21, 59, tzinfo=UTC), date(2026, 3, 29)),
        ("Europe/Paris", datetime(2026, 3, 29, 22, 0, tzinfo=UTC), date(2026, 3, 30)),
    ],
)
def test_the_period_is_the_calendar_day_in_the_budgets_zone(zone: str, moment: datetime, period: date) -> None:
    assert period_for(Budget(timezone=zone), at=moment) == period


def test_an_exhausted_budget_records_what_would_unpark_the_job() -> None:
    exhausted = BudgetExhausted(
        budget_id=4, name="daily", limit="spend", need=250, period=date(2026, 3, 1), detail="budget 'daily': spend"
    )
    assert exhausted.parked_on == {"budget_id": 4, "limit": "spend", "need": 250, "period": "2026-03-01"}
    assert str(exhausted) == "budget 'daily': spend"


@pytest.mark.parametrize(
    ("tokens_in", "tokens_out", "cost"),
    [
        (0, 0, 0),
        (1, 0, 1),  # any fraction of a minor unit rounds up
        (1_000_000, 0, 300),
        (0, 1_000_000, 1500),
        (333_333, 666_667, 1101),  # 99,999,900 + 1,000,000,500 = 1,100,000,400 -> 1100.0004 -> 1101
    ],
)
def test_tokens_are_priced_per_million_and_rounded_up(tokens_in: int, tokens_out: int, cost: int) -> None:
    price = ModelPrice(model="m", input_minor_per_mtok=300, output_minor_per_mtok=1500)
    assert price_tokens(price, input_tokens=tokens_in, output_tokens=tokens_out) == cost


def test_negative_token_counts_are_refused() -> None:
    price = ModelPrice(model="m", input_minor_per_mtok=1, output_minor_per_mtok=1)
    with pytest.raises(ValueError, match="cannot be negative"):
        price_tokens(price, input_tokens=-1, output_tokens=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": " ", "scope": "global"}, "needs a name"),
        ({"name": "b", "scope": "planet"}, "unknown scope 'planet'"),
        ({"name": "b", "scope": "global", "target": "default"}, "a global scope takes no target"),
        ({"name": "b", "scope": "queue"}, r"a queue scope needs a target \(queue name\)"),
        ({"name": "b", "scope": "global", "timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"name": "b", "scope": "global", "currency": "EURO"}, r"budgets are in KOALA_COST_CURRENCY \(EUR\)"),
        ({"name": "b", "scope": "global", "currency": "USD"}, r"a budget in .USD. cannot be kept"),
        ({"name": "b", "scope": "global", "spend_limit_minor": -1}, "cannot be negative"),
        ({"name": "b", "scope": "global", "spend_limit_minor": True}, "must be a whole number"),
        ({"name": "b", "scope": "global", "spend_limit_minor": 1.5}, "must be a whole number"),
        ({"name": "b", "scope": "global", "request_limit": "ten"}, "must be a whole number"),
        ({"name": "b", "scope": "global", "daily_limit": 5}, "unknown budget limit 'daily_limit'"),
    ],
)
def test_a_malformed_budget_is_refused_before_anything_is_written(options: dict[str, Any], message: str) -> None:
    with pytest.raises(SafetyError, match=message):
        create_budget(actor="ops", **options)


def test_a_malformed_limit_change_is_refused_before_the_budget_is_read() -> None:
    with pytest.raises(SafetyError, match="unknown budget limit 'speed'"):
        update_budget(budget_id=1, actor="ops", speed=3)
    with pytest.raises(SafetyError, match="cannot be negative"):
        update_budget(budget_id=1, actor="ops", attempt_limit="-2")


def test_the_raw_budget_rows_name_every_column_of_the_model() -> None:
    """sql.APPLICABLE_BUDGETS names the model's columns: none left to load one by one, none extra."""
    named = [column.strip().removeprefix("b.") for column in sql.BUDGET_COLUMNS.split(",")]
    assert named == [field.column for field in Budget._meta.concrete_fields]
