from __future__ import annotations

from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from exports.demo_data import DEFAULT_START, clear_events, ensure_demo_accounts, generate_events
from exports.errors import ExportError
from exports.services import grant_account_access
from workers.management.commands._common import cli_actor


class Command(BaseCommand):
    help = (
        "Generate demo account events with COPY (about 150k rows/s here: 1M rows in ~7 s). "
        "Rows are spread evenly over the accounts and days, in time order, reproducibly for a given --seed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rows", type=int, default=1_000_000, help="events to add (default 1,000,000)")
        parser.add_argument("--accounts", type=int, default=10, help="demo accounts to spread them over (default 10)")
        parser.add_argument("--start", default=DEFAULT_START.isoformat(), help="first day, YYYY-MM-DD (UTC)")
        parser.add_argument("--days", type=int, default=365, help="number of days (default 365)")
        parser.add_argument("--seed", type=int, default=1, help="random seed: the same seed gives the same data")
        parser.add_argument("--member", action="append", default=[], help="username to give access to every demo account")
        parser.add_argument("--truncate", action="store_true", help="remove all existing events first")
        parser.add_argument("--actor", default=None, help="who grants access (default: $USER@cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rows"] < 0:
            raise CommandError("--rows cannot be negative.")
        try:
            start = date.fromisoformat(options["start"])
        except ValueError:
            raise CommandError(f"--start {options['start']!r} is not a date (YYYY-MM-DD).") from None
        try:
            accounts = ensure_demo_accounts(count=options["accounts"])
            for username in options["member"]:
                for account in accounts:
                    grant_account_access(account_id=account.pk, username=username, actor=cli_actor(options["actor"]))
            if options["truncate"]:
                clear_events()
            result = generate_events(
                rows=options["rows"], accounts=accounts, start=start, days=options["days"], seed=options["seed"]
            )
        except (ValueError, ExportError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"{result.rows:,} events for {len(accounts)} accounts ({', '.join(a.slug for a in accounts[:5])}"
            f"{', …' if len(accounts) > 5 else ''}) from {start} over {options['days']} days "
            f"in {result.seconds:.1f} s ({result.rows_per_second:,.0f} rows/s)"
        )
