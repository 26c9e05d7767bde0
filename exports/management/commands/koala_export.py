from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from exports.errors import ExportError
from exports.models import Account, Export
from exports.selectors import describe_export, get_export, latest_exports
from exports.services import cancel_export, remove_stale_temp_objects, request_export
from koala import cli


def _user(username: str) -> User:
    user = User.objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"user {username!r} does not exist.")
    return user


class Command(BaseCommand):
    help = (
        "Request, inspect and cancel CSV exports. Every action runs as --user and is refused when "
        "that user may not see the account. `create` prints the new export's id."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        user = cli.field_text(User, "username")
        export_id = cli.field_int(Export, "id", minimum=1)
        create = sub.add_parser("create", help="request an export (queued for a worker on the exports queue)")
        create.add_argument("--user", type=user, required=True, help="who requests it (must be a member of the account)")
        create.add_argument("--account", type=cli.field_text(Account, "slug"), required=True, help="account slug, e.g. acme")
        create.add_argument("--from", dest="date_from", type=cli.iso_date, required=True, help="first day, YYYY-MM-DD (UTC)")
        create.add_argument(
            "--to", dest="date_to", type=cli.iso_date, required=True, help="last day, inclusive, YYYY-MM-DD (UTC)"
        )
        create.add_argument("--format", type=cli.field_text(Export, "format"), default="csv", help="output format (csv)")
        for flag, field, what in (("--max-rows", "max_rows", "rows"), ("--max-bytes", "max_bytes", "bytes")):
            create.add_argument(
                flag,
                type=cli.field_int(Export, field, minimum=1),
                default=None,
                help=f"stop (terminally) beyond this many {what}",
            )
        create.add_argument(
            "--time-limit",
            type=cli.finite_float(0.0, 365 * 86_400.0, above_minimum=True),
            default=None,
            help="seconds per attempt before it stops (at most KOALA_EXPORT_MAX_SECONDS)",
        )
        show = sub.add_parser("show", help="print an export's record as JSON")
        show.add_argument("export_id", type=export_id)
        show.add_argument("--user", type=user, required=True)
        listing = sub.add_parser("list", help="the latest exports, one JSON object per line")
        listing.add_argument("--limit", type=cli.bounded_int(1, 1000), default=20, help="at most this many (1-1000)")
        cancel = sub.add_parser("cancel", help="cancel a queued or running export")
        cancel.add_argument("export_id", type=export_id)
        cancel.add_argument("--user", type=user, required=True)
        # The export's job keeps the reason as its error message, at most this long.
        cancel.add_argument("--reason", type=cli.text(500, allow_empty=True), default="")
        sub.add_parser("clean", help="delete temporary objects left by dead attempts of ended exports")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            getattr(self, f"_{options['action']}")(options)
        except ExportError as exc:
            raise CommandError(str(exc)) from None

    def _create(self, options: dict[str, Any]) -> None:
        account = Account.objects.filter(slug=options["account"]).first()
        if account is None:
            raise CommandError(f"account {options['account']!r} does not exist.")
        export = request_export(
            user=_user(options["user"]),
            account_id=account.pk,
            date_from=options["date_from"],
            date_to=options["date_to"],
            format=options["format"],
            max_rows=options["max_rows"],
            max_bytes=options["max_bytes"],
            time_limit_seconds=options["time_limit"],
        )
        self.stdout.write(str(export.pk))

    def _show(self, options: dict[str, Any]) -> None:
        export = get_export(export_id=options["export_id"], user=_user(options["user"]))
        self.stdout.write(json.dumps(describe_export(export=export), indent=2))

    def _list(self, options: dict[str, Any]) -> None:
        for export in latest_exports(limit=options["limit"]):
            self.stdout.write(json.dumps(describe_export(export=export)))

    def _cancel(self, options: dict[str, Any]) -> None:
        export = cancel_export(export_id=options["export_id"], user=_user(options["user"]), reason=options["reason"])
        self.stdout.write(f"export {export.pk} is {export.state}")

    def _clean(self, options: dict[str, Any]) -> None:
        self.stdout.write(f"removed {remove_stale_temp_objects()} temporary object(s)")
