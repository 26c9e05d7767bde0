from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from koala import cli
from workers import kinds
from workers.errors import EnqueueError
from workers.kinds import MAX_INPUT_BYTES
from workers.management.commands._common import add_actor_argument, cli_actor, queue_name, registered_kind
from workers.models import Job
from workers.services.jobs import MAX_DELAY_SECONDS, enqueue


class Command(BaseCommand):
    help = "Enqueue one job. Prints the job id. A reused --key with the same input returns the existing job."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", type=registered_kind, help="registered job kind, e.g. noop")
        parser.add_argument(
            "--input",
            # The service bounds the stored form by the kind's limit; this only bounds what is parsed
            # at all, generously enough for any kind's (six characters, a \uXXXX escape, can write
            # one byte), so the command refuses nothing the service would take.
            type=cli.json_object(6 * max([MAX_INPUT_BYTES, *(kind.max_input_bytes for kind in kinds.served())])),
            default="{}",
            help="JSON object with the job's input (references, not data)",
        )
        parser.add_argument(
            "--key", type=cli.field_text(Job, "idempotency_key"), default=None, help="idempotency key, unique per kind"
        )
        parser.add_argument(
            "--kind-version",
            dest="kind_version",
            type=cli.field_int(Job, "version", minimum=1),
            default=None,
            help="contract version (default: newest registered)",
        )
        parser.add_argument("--queue", type=queue_name, default=None, help="override the kind's queue (a configured one)")
        parser.add_argument("--priority", type=cli.field_int(Job, "priority"), default=0, help="higher runs first")
        parser.add_argument(
            "--delay", type=cli.finite_float(0.0, MAX_DELAY_SECONDS), default=0.0, help="seconds before the job is due"
        )
        add_actor_argument(parser, "enqueues")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = enqueue(
                kind=options["kind"],
                input=options["input"],
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
