from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.errors import JobStateError
from workers.management.commands._common import cli_actor
from workers.services.jobs import cancel_job


class Command(BaseCommand):
    help = "Cancel a queued or running job. A running body sees its cancel signal at the next heartbeat."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=int)
        parser.add_argument("--reason", default="", help="why (stored and audited)")
        parser.add_argument("--actor", default=None, help="who cancels (default: $USER@cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = cancel_job(job_id=options["job_id"], actor=cli_actor(options["actor"]), reason=options["reason"])
        except JobStateError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"job {job.pk} cancelled")
