"""Parsing shared by Koala's management commands (they parse and call services, nothing more)."""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import CommandError

from workers.models import Job


def cli_actor(explicit: str | None) -> str:
    if explicit:
        return explicit
    try:
        return f"{getpass.getuser()}@cli"
    except (KeyError, OSError):
        return "unknown@cli"


def parse_json_object(text: str, *, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{option} is not valid JSON: {exc.msg} at position {exc.pos}.") from None
    if not isinstance(value, dict):
        raise CommandError(f'{option} must be a JSON object, e.g. \'{{"key": "value"}}\'.')
    return value


def existing_job(job_id: int) -> Job:
    try:
        return Job.objects.get(pk=job_id)
    except Job.DoesNotExist:
        raise CommandError(f"job {job_id} does not exist.") from None


def scope_from_options(options: dict[str, Any]) -> tuple[str, str]:
    """(scope, target) from the --global / --queue / --kind options of koala_pause and koala_resume."""
    if options.get("everything"):
        return "global", ""
    if options.get("queue"):
        return "queue", options["queue"]
    return "kind", options.get("kind") or ""
