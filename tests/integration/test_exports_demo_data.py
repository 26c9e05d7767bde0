"""The demo data generator: COPY-fast, reproducible, realistic enough to export."""

from __future__ import annotations

import io
import re
from datetime import date

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from exports.demo_data import ensure_demo_accounts, generate_events
from exports.models import Account, Event

# Plain django_db: the generator COPYs on the test's own connection, and the rollback removes it all.
pytestmark = pytest.mark.django_db


def table_digest() -> tuple[int, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), md5(string_agg(concat_ws('|', a.slug, occurred_at, event_type, user_ref, amount_minor, "
            "currency, country, detail), ',' ORDER BY e.id)) FROM exports_event e JOIN exports_account a ON a.id = e.account_id"
        )
        count, digest = cursor.fetchone()
    return count, digest


def test_same_seed_same_data_spread_over_accounts_and_days() -> None:
    accounts = ensure_demo_accounts(count=3)
    generate_events(rows=9_000, accounts=accounts, start=date(2026, 5, 1), days=30, seed=42)
    first = table_digest()
    Event.objects.all().delete()
    generate_events(rows=9_000, accounts=accounts, start=date(2026, 5, 1), days=30, seed=42)
    assert table_digest() == first and first[0] == 9_000
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(occurred_at)::date, max(occurred_at)::date, count(DISTINCT occurred_at::date) FROM exports_event"
        )
        assert cursor.fetchone() == (date(2026, 5, 1), date(2026, 5, 30), 30)
        cursor.execute("SELECT account_id, count(*) FROM exports_event GROUP BY 1")
        per_account = dict(cursor.fetchall())
    assert set(per_account) == {a.pk for a in accounts}
    assert all(2_700 < n < 3_300 for n in per_account.values()), per_account
    # Details that need CSV quoting are part of the data.
    assert Event.objects.filter(detail__contains='"').exists() and Event.objects.filter(detail__contains=",").exists()


def test_generate_refuses_bad_sizes() -> None:
    accounts = ensure_demo_accounts(count=1)
    with pytest.raises(ValueError, match="rows cannot be negative"):
        generate_events(rows=-1, accounts=accounts)
    with pytest.raises(ValueError, match="days must be between"):
        generate_events(rows=1, accounts=accounts, days=0)
    with pytest.raises(ValueError, match="at least one account"):
        generate_events(rows=1, accounts=[])
    with pytest.raises(CommandError, match="not a date"):
        call_command("koala_demo_data", "--rows", "1", "--start", "yesterday")


@pytest.mark.slow
@pytest.mark.alone  # a throughput bound: other tests' CPU and PostgreSQL load would be measured too
@pytest.mark.django_db(transaction=True)  # the command's own commit is part of the time measured
def test_one_million_rows_in_well_under_a_minute() -> None:
    out = io.StringIO()
    call_command("koala_demo_data", "--rows", "1000000", "--accounts", "10", stdout=out)
    match = re.search(r"^1,000,000 events for 10 accounts .* in ([\d.]+) s \(([\d,]+) rows/s\)$", out.getvalue().strip())
    assert match, out.getvalue()
    seconds = float(match.group(1))
    assert seconds < 30, f"1M rows took {seconds:.1f}s"
    assert Event.objects.count() == 1_000_000 and Account.objects.count() == 10
