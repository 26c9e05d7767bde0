from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from exports.demo_data import (
    DEFAULT_START,
    MAX_ACCOUNTS,
    MAX_DAYS,
    MAX_ROWS,
    clear_events,
    ensure_demo_accounts,
    generate_events,
)
from exports.errors import ExportError
from exports.services import grant_account_access
from koala import cli
from workers.management.commands._common import add_actor_argument, cli_actor


class Command(BaseCommand):
    help = (
        "Generate demo account events with COPY (about 150k rows/s here: 1M rows in ~7 s). "
        "Rows are spread evenly over the accounts and days, in time order, reproducibly for a given --seed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--rows", type=cli.bounded_int(0, MAX_ROWS), default=1_000_000, help="events to add (default 1,000,000)"
        )
        parser.add_argument(
            "--accounts",
            type=cli.bounded_int(1, MAX_ACCOUNTS),
            default=10,
            help="demo accounts to spread them over (default 10)",
        )
        parser.add_argument("--start", type=cli.iso_date, default=DEFAULT_START.isoformat(), help="first day, YYYY-MM-DD (UTC)")
        parser.add_argument("--days", type=cli.bounded_int(1, MAX_DAYS), default=365, help="number of days (default 365)")
        parser.add_argument(
            "--seed", type=cli.bounded_int(-(2**63), 2**63 - 1), default=1, help="random seed: the same seed gives the same data"
        )
        parser.add_argument(
            "--member",
            type=cli.field_text(User, "username"),
            action="append",
            default=[],
            help="username to give access to every demo account",
        )
        parser.add_argument("--truncate", action="store_true", help="remove all existing events first")
        add_actor_argument(parser, "grants access")

    def handle(self, *args: Any, **options: Any) -> None:
        # Everything is checked before the first account is made: a typo in a name must not
        # leave new accounts (or, with --truncate, no events) behind.
        members = options["member"]
        known = set(User.objects.filter(username__in=members).values_list("username", flat=True))
        missing = [name for name in members if name not in known]
        if missing:
            raise CommandError(f"--member: user {missing[0]!r} does not exist.")
        start = options["start"]
        try:
            start + timedelta(days=options["days"])
        except OverflowError:
            raise CommandError(f"--days: {options['days']} days from {start} go beyond the last date there is.") from None
        try:
            accounts = ensure_demo_accounts(count=options["accounts"])
            for username in members:
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
