"""The export's one query: an account's events in a UTC date range, in (occurred_at, id) order.

Kept in one place so the job, the benchmark's baseline and the documentation run the same SQL.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

COLUMNS = "id, occurred_at, event_type, user_ref, amount_minor, currency, country, detail"


def window(*, date_from: date, date_to: date) -> tuple[datetime, datetime]:
    """[start, end) in UTC for inclusive calendar days ``date_from``..``date_to``."""
    start = datetime.combine(date_from, time.min, tzinfo=UTC)
    return start, datetime.combine(date_to + timedelta(days=1), time.min, tzinfo=UTC)


def select_sql(*, account_id: int, date_from: date, date_to: date, limit: int | None = None) -> tuple[str, dict[str, Any]]:
    start, end = window(date_from=date_from, date_to=date_to)
    sql = (
        f"SELECT {COLUMNS} FROM exports_event "
        "WHERE account_id = %(account)s AND occurred_at >= %(start)s AND occurred_at < %(end)s "
        "ORDER BY occurred_at, id"
    )
    params: dict[str, Any] = {"account": account_id, "start": start, "end": end}
    if limit is not None:
        sql += " LIMIT %(limit)s"
        params["limit"] = limit
    return sql, params


def copy_sql(select: str) -> str:
    """CSV with a header line, as PostgreSQL writes it (RFC 4180 quoting, UTF-8)."""
    return f"COPY ({select}) TO STDOUT WITH (FORMAT csv, HEADER)"
