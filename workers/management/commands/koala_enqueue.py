from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from workers.errors import EnqueueError
from workers.management.commands._common import cli_actor, parse_json_object
from workers.services.jobs import enqueue


class Command(BaseCommand):
    help = "Enqueue one job. Prints the job id. A reused --key with the same input returns the existing job."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", help="registered job kind, e.g. noop")
        parser.add_argument("--input", default="{}", help="JSON object with the job's input (references, not data)")
        parser.add_argument("--key", default=None, help="idempotency key, unique per kind")
        parser.add_argument(
            "--kind-version", dest="kind_version", type=int, default=None, help="contract version (default: newest registered)"
        )
        parser.add_argument("--queue", default=None, help="override the kind's queue")
        parser.add_argument("--priority", type=int, default=0, help="higher runs first")
        parser.add_argument("--delay", type=float, default=0.0, help="seconds before the job is due")
        parser.add_argument("--actor", default=None, help="who enqueues (default: $USER@cli)")

    def handle(self, *args: Any, **options: Any) -> None:
        data = parse_json_object(options["input"], option="--input")
        try:
            result = enqueue(
                kind=options["kind"],
                input=data,
                idempotency_key=options["key"],
                version=options["kind_version"],
                queue=options["queue"],
                priority=options["priority"],
                delay_seconds=options["delay"],
                created_by=cli_actor(options["actor"]),
            )
        except EnqueueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(result.job_id))
        if not result.created:
            self.stderr.write(f"job {result.job_id} already existed for this key and input; nothing new was enqueued")
