"""Parsing shared by Koala's management commands (they parse and call services, nothing more).

The generic argument types are in ``koala.cli``; these are Koala's own: who acts, which job,
queue or kind. Every one refuses a bad value while argv is parsed (argparse's one-line error,
exit 2), before the command does anything.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from django.core.management.base import CommandError, CommandParser

from koala import cli
from koala.models import AuditEvent
from workers import targets
from workers.errors import SafetyError, UnknownName
from workers.models import Job, Pause, Scope


def cli_actor(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "unknown@cli"


# Who acts is stored in every audit row (and as created_by, decided_by, …: all this long).
actor = cli.field_text(AuditEvent, "actor")


def add_actor_argument(parser: CommandParser, verb: str) -> None:
    parser.add_argument("--actor", type=actor, default=None, help=f"who {verb} (default: $USER@cli)")


def id_of(model: type[Any]) -> cli.Parse:
    """A primary key the model's id column can hold (1 up); whether the row exists is the command's to say."""
    return cli.field_int(model, "id", minimum=1)


job_id = id_of(Job)


def _named_by(check: Any, parse_text: cli.Parse) -> cli.Parse:
    def parse(value: str) -> str:
        try:
            return str(check(parse_text(value)))
        except UnknownName as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


# A configured queue (settings.RQ_QUEUES), and a kind this process registers or that has jobs.
queue_name = _named_by(targets.check_queue, cli.field_text(Job, "queue"))
kind_name = _named_by(targets.check_kind, cli.field_text(Job, "kind"))
registered_kind = _named_by(lambda name: targets.check_kind(name, with_jobs=False), cli.field_text(Job, "kind"))


def tenant_name(value: str) -> str:
    """A pause's or budget's tenant (workers.targets.check_tenant); "" for every tenant."""
    try:
        return targets.check_tenant(cli.field_text(Pause, "tenant", allow_empty=True)(value))
    except SafetyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def scope_name(value: str) -> str:
    if value not in Scope.values:
        raise argparse.ArgumentTypeError(str(UnknownName("scope", value, list(Scope.values))))
    return value


def queue_list(value: str) -> list[str]:
    """Comma-separated configured queues, in priority order, at least one."""
    names = [name.strip() for name in value.split(",")]
    if not value.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"{cli.shown(value)} is not a comma-separated list of queue names")
    return [queue_name(name) for name in names]


def existing_job(job_id: int) -> Job:
    try:
        return Job.objects.get(pk=job_id)
    except Job.DoesNotExist:
        raise CommandError(f"job {job_id} does not exist.") from None


def scope_from_options(options: dict[str, Any]) -> tuple[str, str]:
    """(scope, target) from the --global / --queue / --kind options of koala_pause and koala_resume."""
    if options.get("everything"):
        return "global", ""
    if options.get("queue") is not None:
        return "queue", options["queue"]
    return "kind", options.get("kind") or ""
