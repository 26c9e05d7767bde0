"""The exports app's SQL: the export's one query (an account's events in a UTC date range, in
(occurred_at, id) order, and the COPY around it) and the settling of engine-decided outcomes.

Kept in one place so the job, the benchmark's baseline and the documentation run the same SQL.
The engine's own statements are in workers.sql; an export attempt's writes are fenced by the
engine's one strict fence (workers.services.leases.hold_lease, see exports.jobs).
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
        f"SELECT {COLUMNS} FROM exports_event "  # noqa: S608 (COLUMNS is a constant; values are bound)
        "WHERE account_id = %(account)s AND occurred_at >= %(start)s AND occurred_at < %(end)s "
        "ORDER BY occurred_at, id"
    )
    params: dict[str, Any] = {"account": account_id, "start": start, "end": end}
    if limit is not None:
        sql += " LIMIT %(limit)s"
        params["limit"] = limit
    return sql, params


def copy_sql(select: str) -> str:
    """CSV with a header line, as PostgreSQL writes it (RFC 4180 quoting, UTF-8).

    ``select`` is select_sql's statement (its values stay bound parameters)."""
    return f"COPY ({select}) TO STDOUT WITH (FORMAT csv, HEADER)"


# Copy the outcome the engine decided on its own (attempts exhausted, orphaned, a job cancelled
# with koala_cancel) into every export still queued or running whose job has failed or been
# cancelled ({only}: every export, or those in %(ids)s; filled below with constants only).
_SETTLE_EXPORTS = """
UPDATE exports_export e
SET state = j.state,
    failure_code = CASE WHEN j.state = 'failed' THEN COALESCE(j.failure_reason, 'failed') ELSE '' END,
    error_message = LEFT(j.error_message, 500),
    finished_at = COALESCE(j.finished_at, now()),
    updated_at = now()
FROM workers_job j
WHERE e.job_id = j.id AND e.state IN ('queued', 'running') AND j.state IN ('failed', 'cancelled') {only}
"""
SETTLE_EXPORTS = _SETTLE_EXPORTS.format(only="")
SETTLE_EXPORTS_BY_ID = _SETTLE_EXPORTS.format(only="AND e.id = ANY(%(ids)s)")
