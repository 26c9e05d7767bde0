from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers.errors import JobStateError
from workers.management.commands._common import add_actor_argument, cli_actor, job_id
from workers.services.jobs import cancel_job


class Command(BaseCommand):
    help = "Cancel a queued or running job. A running body sees its cancel signal at the next heartbeat."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=job_id)
        # The job keeps the reason as its error message, at most this long.
        parser.add_argument("--reason", type=cli.text(500, allow_empty=True), default="", help="why (stored and audited)")
        add_actor_argument(parser, "cancels")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = cancel_job(job_id=options["job_id"], actor=cli_actor(options["actor"]), reason=options["reason"])
        except JobStateError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"job {job.pk} cancelled")
