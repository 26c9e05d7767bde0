from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from koala import cli
from workers.errors import SafetyError
from workers.management.commands._common import (
    add_actor_argument,
    cli_actor,
    kind_name,
    queue_name,
    scope_from_options,
    tenant_name,
)
from workers.services.pauses import active_pauses, pause

MAX_PAUSE_MINUTES = 366 * 24 * 60.0


class Command(BaseCommand):
    help = (
        "Pause claiming globally, for one queue or for one kind; with --tenant, only the jobs whose input names "
        "that tenant. drain: running work finishes, nothing new starts. "
        "stop: running attempts are cancelled at their next heartbeat and released without using an attempt. "
        "Without a scope, lists the live pauses."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--global", dest="everything", action="store_true", help="pause everything")
        where.add_argument("--queue", type=queue_name, help="pause one (configured) queue")
        where.add_argument("--kind", type=kind_name, help="pause one job kind (registered, or with jobs)")
        parser.add_argument(
            "--tenant",
            type=tenant_name,
            default="",
            help="hold only this tenant's jobs (the input's \"tenant\"); default: every tenant",
        )
        parser.add_argument("--mode", choices=["drain", "stop"], default="drain")
        # The pause keeps at most this much of the reason (redacted); longer is refused, not cut.
        parser.add_argument(
            "--reason", type=cli.text(1000, allow_empty=True), default="", help="why (required; shown on every admin page)"
        )
        parser.add_argument(
            "--expires-in",
            type=cli.finite_float(0.0, MAX_PAUSE_MINUTES, above_minimum=True),
            default=None,
            metavar="MINUTES",
            help="lift automatically after this (up to a year)",
        )
        add_actor_argument(parser, "pauses")

    def handle(self, *args: Any, **options: Any) -> None:
        # A scope given as "" is refused by its type; only no scope at all lists the pauses.
        if not options["everything"] and options["queue"] is None and options["kind"] is None:
            if options["tenant"]:
                raise CommandError("--tenant pauses a scope for one tenant: give the scope too (--global, --queue or --kind).")
            rows = active_pauses()
            if not rows:
                self.stdout.write("nothing is paused")
            for row in rows:
                until = f" until {row.expires_at:%Y-%m-%d %H:%M:%SZ}" if row.expires_at else ""
                tenant = f" tenant {row.tenant}" if row.tenant else ""
                self.stdout.write(
                    f"pause {row.pk}: {row.scope} {row.target or '*'}{tenant} {row.mode} ({row.source}) by {row.created_by} "
                    f"at {row.created_at:%Y-%m-%d %H:%M:%SZ}{until}: {row.reason}"
                )
            return
        scope, target = scope_from_options(options)
        expires = timezone.now() + timedelta(minutes=options["expires_in"]) if options["expires_in"] else None
        try:
            row = pause(
                scope=scope,
                target=target,
                tenant=options["tenant"],
                mode=options["mode"],
                reason=options["reason"],
                actor=cli_actor(options["actor"]),
                expires_at=expires,
            )
        except SafetyError as exc:
            raise CommandError(str(exc)) from None
        tenant = f" tenant {row.tenant}" if row.tenant else ""
        self.stdout.write(f"pause {row.pk}: {scope} {target or '*'}{tenant} paused ({row.mode})")
