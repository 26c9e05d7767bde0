"""The exports app's own hand-written SQL: statements that touch only its tables (``exports_event``).

The export's one query (an account's events in a UTC date range, in (occurred_at, id) order,
and the COPY around it) and the demo data set's bulk load. Kept in one place so the job, the
benchmark's baseline and the documentation run the same SQL.

A statement that reads or writes an engine table (``workers_*``), even together with this
app's tables, lives in ``workers/sql.py`` (settling engine-decided outcomes:
``SETTLE_EXPORTS``); an export attempt's writes are fenced by the engine's one strict fence
(workers.services.leases.hold_lease, see exports.jobs). The rules are ``workers/sql.py``'s:
named constants with a one-line purpose, values always bound parameters, text composed once at
import; ``select_sql`` and ``copy_sql`` only choose among those texts.
``tests/unit/test_sql_home.py`` checks that these statements name no other app's table.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any

COLUMNS = "id, occurred_at, event_type, user_ref, amount_minor, currency, country, detail"

# -- the export (exports.jobs) --------------------------------------------------------------------

# An account's events (%(account)s) in [%(start)s, %(end)s), in the order of the index
# (account_id, occurred_at, id) that serves the query and is its keyset.
EXPORT_EVENTS = (
    f"SELECT {COLUMNS} FROM exports_event "  # noqa: S608 (COLUMNS is a constant; values are bound)
    "WHERE account_id = %(account)s AND occurred_at >= %(start)s AND occurred_at < %(end)s "
    "ORDER BY occurred_at, id"
)
# … at most %(limit)s of them (the job asks for one more than the export's row limit).
EXPORT_EVENTS_LIMITED = EXPORT_EVENTS + " LIMIT %(limit)s"

# CSV with a header line, as PostgreSQL writes it (RFC 4180 quoting, UTF-8), of each select above.
COPY_CSV = {select: f"COPY ({select}) TO STDOUT WITH (FORMAT csv, HEADER)" for select in (EXPORT_EVENTS, EXPORT_EVENTS_LIMITED)}


def window(*, date_from: date, date_to: date) -> tuple[datetime, datetime]:
    """[start, end) in UTC for inclusive calendar days ``date_from``..``date_to``."""
    start = datetime.combine(date_from, time.min, tzinfo=UTC)
    return start, datetime.combine(date_to + timedelta(days=1), time.min, tzinfo=UTC)


def select_sql(*, account_id: int, date_from: date, date_to: date, limit: int | None = None) -> tuple[str, dict[str, Any]]:
    """The export's select (EXPORT_EVENTS, or EXPORT_EVENTS_LIMITED with a limit) and its parameters."""
    start, end = window(date_from=date_from, date_to=date_to)
    params: dict[str, Any] = {"account": account_id, "start": start, "end": end}
    if limit is None:
        return EXPORT_EVENTS, params
    return EXPORT_EVENTS_LIMITED, {**params, "limit": limit}


def copy_sql(select: str) -> str:
    """CSV with a header line, as PostgreSQL writes it (RFC 4180 quoting, UTF-8).

    ``select`` is select_sql's statement (its values stay bound parameters); any other is refused."""
    try:
        return COPY_CSV[select]
    except KeyError:
        raise ValueError("copy_sql takes one of select_sql's statements") from None


# -- the demo data set (exports.demo_data) ----------------------------------------------------------

# Append events from the client in COPY's text format: tab-separated, these columns in this order.
COPY_EVENTS_IN = (
    "COPY exports_event (account_id, occurred_at, event_type, user_ref, amount_minor, currency, country, detail) FROM STDIN"
)

# Remove every event (the demo data set only; exports keep their published objects).
TRUNCATE_EVENTS = "TRUNCATE exports_event"

# Fresh statistics after a bulk load, so the export query is planned for the rows just loaded.
ANALYZE_EVENTS = "ANALYZE exports_event"


# -- the COPY's own transaction through a transaction pooler (exports/streaming.py) -------------
# KOALA_DATABASE_POOLING=transaction: the reader's settings cannot be session settings (the next
# transaction may get another server session), so the COPY runs in a read-only transaction of its
# own with the settings local to it, and that transaction is ended before the connection closes.
BEGIN_READ_ONLY = "BEGIN READ ONLY"
SET_LOCAL = "SELECT set_config(%s, %s, true)"
ROLLBACK = "ROLLBACK"
