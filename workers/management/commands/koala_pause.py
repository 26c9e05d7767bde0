from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from workers.errors import SafetyError
from workers.management.commands._common import cli_actor, scope_from_options
from workers.services.pauses import active_pauses, pause


class Command(BaseCommand):
    help = (
        "Pause claiming globally, for one queue or for one kind. drain: running work finishes, nothing new starts. "
        "stop: running attempts are cancelled at their next heartbeat and released without using an attempt. "
        "Without a scope, lists the live pauses."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--global", dest="everything", action="store_true", help="pause everything")
        where.add_argument("--queue", help="pause one queue")
        where.add_argument("--kind", help="pause one job kind")
        parser.add_argument("--mode", choices=["drain", "stop"], default="drain")
        parser.add_argument("--reason", default="", help="why (required; shown on every admin page)")
        parser.add_argument("--expires-in", type=float, default=None, metavar="MINUTES", help="lift automatically after this")
        parser.add_argument("--actor", default=None, help="who pauses (default: $USER@cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not (options["everything"] or options["queue"] or options["kind"]):
            rows = active_pauses()
            if not rows:
                self.stdout.write("nothing is paused")
            for row in rows:
                until = f" until {row.expires_at:%Y-%m-%d %H:%M:%SZ}" if row.expires_at else ""
                self.stdout.write(
                    f"pause {row.pk}: {row.scope} {row.target or '*'} {row.mode} ({row.source}) by {row.created_by} "
                    f"at {row.created_at:%Y-%m-%d %H:%M:%SZ}{until}: {row.reason}"
                )
            return
        if options["expires_in"] is not None and options["expires_in"] <= 0:
            raise CommandError("--expires-in must be a positive number of minutes.")
        scope, target = scope_from_options(options)
        expires = timezone.now() + timedelta(minutes=options["expires_in"]) if options["expires_in"] else None
        try:
            row = pause(
                scope=scope,
                target=target,
                mode=options["mode"],
                reason=options["reason"],
                actor=cli_actor(options["actor"]),
                expires_at=expires,
            )
        except SafetyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"pause {row.pk}: {scope} {target or '*'} paused ({row.mode})")
