from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.errors import JobStateError
from workers.management.commands._common import add_actor_argument, cli_actor, job_id
from workers.services.jobs import requeue_job


class Command(BaseCommand):
    help = (
        "Make a waiting job due now, or take a running job from a stuck worker "
        "(the old holder is fenced: its reports are rejected)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=job_id)
        add_actor_argument(parser, "requeues")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            job = requeue_job(job_id=options["job_id"], actor=cli_actor(options["actor"]))
        except JobStateError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"job {job.pk} queued, due now")
