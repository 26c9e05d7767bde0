from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers.errors import SafetyError
from workers.management.commands._common import add_actor_argument, cli_actor, id_of, scope_from_options
from workers.models import Pause
from workers.services.pauses import active_pauses, resume


class Command(BaseCommand):
    help = (
        "Lift a pause (by id, or by scope: --global / --queue NAME / --kind NAME, with --tenant NAME for a tenant's "
        "pause). Its queued jobs resume at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("pause_id", nargs="?", type=id_of(Pause), help="the pause's id (koala_pause lists them)")
        where.add_argument("--global", dest="everything", action="store_true")
        # Any name a pause may hold (a retired queue's pause must stay liftable); "not paused" otherwise.
        where.add_argument("--queue", type=cli.field_text(Pause, "target"))
        where.add_argument("--kind", type=cli.field_text(Pause, "target"))
        # Any name a pause may hold; "not paused" otherwise. Empty: the pause of every tenant.
        parser.add_argument(
            "--tenant",
            type=cli.field_text(Pause, "tenant", allow_empty=True),
            default="",
            help="with a scope: the pause of this tenant (default: the pause of every tenant)",
        )
        # The audit row keeps at most this much of the note; longer is refused, not cut.
        parser.add_argument("--note", type=cli.text(500, allow_empty=True), default="", help="why it is safe to resume (audited)")
        add_actor_argument(parser, "resumes")

    def handle(self, *args: Any, **options: Any) -> None:
        pause_id = options["pause_id"]
        tenant = options["tenant"]
        if pause_id is None:
            scope, target = scope_from_options(options)
            live = [p for p in active_pauses() if (p.scope, p.target, p.tenant) == (scope, target, tenant)]
            if not live:
                lapsed = Pause.objects.filter(scope=scope, target=target, tenant=tenant, lifted_at__isnull=True).first()
                if lapsed is None:
                    others = [p.tenant for p in active_pauses() if (p.scope, p.target) == (scope, target) and p.tenant]
                    hint = f" (paused for tenant {', '.join(others)}: add --tenant)" if others and not tenant else ""
                    raise CommandError(f"{Pause(scope=scope, target=target, tenant=tenant).covers} is not paused{hint}.")
                live = [lapsed]
            pause_id = live[0].pk
        elif tenant:
            raise CommandError("--tenant picks a pause by scope; a pause id names one already.")
        try:
            row = resume(pause_id=pause_id, actor=cli_actor(options["actor"]), note=options["note"])
        except SafetyError as exc:
            raise CommandError(str(exc)) from None
        tenant_text = f" tenant {row.tenant}" if row.tenant else ""
        self.stdout.write(f"pause {row.pk} lifted: {row.scope} {row.target or '*'}{tenant_text} resumed")
