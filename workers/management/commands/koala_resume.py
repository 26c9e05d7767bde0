from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers.errors import SafetyError
from workers.management.commands._common import add_actor_argument, cli_actor, id_of, scope_from_options
from workers.models import Pause
from workers.services.pauses import active_pauses, resume


class Command(BaseCommand):
    help = "Lift a pause (by id, or by scope: --global / --queue NAME / --kind NAME). Its queued jobs resume at once."

    def add_arguments(self, parser: CommandParser) -> None:
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("pause_id", nargs="?", type=id_of(Pause), help="the pause's id (koala_pause lists them)")
        where.add_argument("--global", dest="everything", action="store_true")
        # Any name a pause may hold (a retired queue's pause must stay liftable); "not paused" otherwise.
        where.add_argument("--queue", type=cli.field_text(Pause, "target"))
        where.add_argument("--kind", type=cli.field_text(Pause, "target"))
        # The audit row keeps at most this much of the note; longer is refused, not cut.
        parser.add_argument("--note", type=cli.text(500, allow_empty=True), default="", help="why it is safe to resume (audited)")
        add_actor_argument(parser, "resumes")

    def handle(self, *args: Any, **options: Any) -> None:
        pause_id = options["pause_id"]
        if pause_id is None:
            scope, target = scope_from_options(options)
            live = [p for p in active_pauses() if p.scope == scope and p.target == target]
            if not live:
                lapsed = Pause.objects.filter(scope=scope, target=target, lifted_at__isnull=True).first()
                if lapsed is None:
                    raise CommandError(f"{scope} {target or '*'} is not paused.")
                live = [lapsed]
            pause_id = live[0].pk
        try:
            row = resume(pause_id=pause_id, actor=cli_actor(options["actor"]), note=options["note"])
        except SafetyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"pause {row.pk} lifted: {row.scope} {row.target or '*'} resumed")
