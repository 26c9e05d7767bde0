from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from koala import cli
from workers.management.commands._common import kind_name, queue_name
from workers.models import Job, JobState


class Command(BaseCommand):
    help = "List jobs, newest first, optionally filtered by state, kind or queue."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--state", choices=JobState.values)
        parser.add_argument("--kind", type=kind_name, help="a registered kind, or one with jobs")
        parser.add_argument("--queue", type=queue_name, help="a configured queue")
        parser.add_argument("--limit", type=cli.bounded_int(1, 10_000), default=50, help="at most this many rows (1-10000)")

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = Job.objects.order_by("-id")
        for field in ("state", "kind", "queue"):
            if options[field] is not None:
                jobs = jobs.filter(**{field: options[field]})
        self.stdout.write(f"{'id':>8}  {'kind':<20} {'queue':<10} {'state':<10} {'attempts':>8}  {'scheduled_at':<25} reason")
        for job in jobs[: options["limit"]]:
            self.stdout.write(
                f"{job.pk:>8}  {job.kind + '@' + str(job.version):<20} {job.queue:<10} {job.state:<10} "
                f"{f'{job.attempts}/{job.max_attempts}':>8}  {job.scheduled_at.isoformat(timespec='seconds'):<25} "
                f"{job.failure_reason or ''}"
            )
