from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from api.keys import ApiKeyError, KeyScope, create_key, key_by_prefix, revoke_key
from api.models import ApiKey
from koala import cli
from workers.management.commands._common import add_actor_argument, cli_actor


def scope(value: str) -> str:
    if value not in {s.value for s in KeyScope}:
        raise argparse.ArgumentTypeError(f"unknown scope {cli.shown(value)}; known: {', '.join(KeyScope)}")
    return value


def prefix(value: str) -> str:
    value = cli.text(40)(value)
    bare = value.removeprefix("kk_")
    if len(bare) != 8 or any(ch not in "0123456789abcdef" for ch in bare):
        raise argparse.ArgumentTypeError(f"{cli.shown(value)} is not a key prefix (8 hex characters, e.g. kk_1a2b3c4d)")
    return bare


def names(value: str) -> list[str]:
    """A comma-separated list of names, none empty (``--kinds a,b@2``, ``--queues q1,q2``)."""
    value = cli.text(2000)(value)
    items = [item.strip() for item in value.split(",")]
    if any(not item for item in items):
        raise argparse.ArgumentTypeError(f"{cli.shown(value)} has an empty name; separate names with single commas")
    return items


def _limit(values: list[str]) -> str:
    return ",".join(values) if values else "any"


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


class Command(BaseCommand):
    help = (
        "API keys (docs/worker-api.md, Keys): `create --name N --scope worker|execute|write|admin [--scope …] "
        "[--kinds K[@V],…] [--queues Q,…] [--person USER] [--expires-in-days D]` prints the raw key once (its last "
        "line); `list`; `revoke PREFIX`."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print it (once)")
        create.add_argument("--name", type=cli.field_text(ApiKey, "name"), required=True, help="what the key is for")
        create.add_argument(
            "--scope", dest="scopes", type=scope, action="append", required=True, help="worker, execute, write or admin (repeat)"
        )
        create.add_argument(
            "--person",
            type=cli.username(get_user_model()),
            default=None,
            help="the user the key acts for (default: a machine key)",
        )
        create.add_argument("--expires-in-days", type=cli.bounded_int(1, 3660), default=None, help="default: never expires")
        create.add_argument(
            "--kinds",
            type=names,
            default=[],
            help="the job kinds the key may serve, start and read: name (any version) or name@version, "
            "comma-separated (default: any)",
        )
        create.add_argument(
            "--queues", type=names, default=[], help="the queues it may serve and start jobs on, comma-separated (default: any)"
        )
        add_actor_argument(create, "creates the key")
        sub.add_parser("list", help="every key: prefix, name, scopes, kinds, queues, person, expiry, revocation, last use")
        revoke = sub.add_parser("revoke", help="revoke a key at once (every server process forgets it)")
        revoke.add_argument("prefix", type=prefix, help="the key's prefix, e.g. kk_1a2b3c4d")
        add_actor_argument(revoke, "revokes the key")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "create":
                days = options["expires_in_days"]
                person = options["person"] or ""
                row, raw = create_key(
                    name=options["name"],
                    scopes=options["scopes"],
                    person=person,
                    expires_at=timezone.now() + timedelta(days=days) if days else None,
                    actor=cli_actor(options["actor"]),
                    kinds=options["kinds"],
                    queues=options["queues"],
                )
                self.stdout.write(
                    f"created key kk_{row.prefix} ({row.name}; scopes {', '.join(row.scopes)}; "
                    f"{'person ' + person if person else 'machine key'}; kinds {_limit(row.kinds)}; "
                    f"queues {_limit(row.queues)}; expires {_when(row.expires_at)}). "
                    "Copy it now, it is not shown again:"
                )
                self.stdout.write(raw)
            elif options["action"] == "revoke":
                row = revoke_key(key_id=key_by_prefix(options["prefix"]).pk, actor=cli_actor(options["actor"]))
                self.stdout.write(f"revoked key kk_{row.prefix} ({row.name})")
            else:
                self._list()
        except ApiKeyError as exc:
            raise CommandError(str(exc)) from None

    def _list(self) -> None:
        rows = list(ApiKey.objects.select_related("person"))
        if not rows:
            self.stdout.write("no API keys")
        for row in rows:
            person = row.person.get_username() if row.person else "-"
            revoked = f"revoked {_when(row.revoked_at)} by {row.revoked_by}" if row.revoked_at else "active"
            self.stdout.write(
                f"kk_{row.prefix}  {row.name}  scopes={','.join(row.scopes)}  kinds={_limit(row.kinds)}  "
                f"queues={_limit(row.queues)}  person={person}  "
                f"expires={_when(row.expires_at)}  {revoked}  last_used={_when(row.last_used_at)}"
            )
