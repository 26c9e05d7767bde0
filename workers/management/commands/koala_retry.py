from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.errors import JobStateError
from workers.management.commands._common import add_actor_argument, cli_actor, job_id
from workers.services.jobs import retry_job


class Command(BaseCommand):
    help = "Run a failed or cancelled job again as a new job linked to it (terminal states never revert). Prints the new id."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=job_id)
        add_actor_argument(parser, "retries")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = retry_job(job_id=options["job_id"], actor=cli_actor(options["actor"]))
        except JobStateError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(result.job_id))
