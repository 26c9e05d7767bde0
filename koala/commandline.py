"""What a manage.py command line asks for, decided before the settings load.

Help (``manage.py``, ``manage.py help [COMMAND]``, ``manage.py COMMAND --help``, ``version``)
runs nothing, so it must work on a fresh clone with no PostgreSQL or Redis configured. The
settings stay strict: for help only, manage.py fills in placeholder URLs that nothing uses;
every other command still stops with "DATABASE_URL is not set".
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

HELP_FLAGS = frozenset({"-h", "--help"})
TOP_LEVEL_HELP = frozenset({"help", "version", "--version", *HELP_FLAGS})
# Well-formed and never reachable (.invalid does not resolve, RFC 2606): if help ever did connect,
# it would fail at once instead of reaching some other server.
PLACEHOLDERS = {
    "DATABASE_URL": "postgres://help-needs-no-database.invalid/none",
    "REDIS_URL": "redis://help-needs-no-redis.invalid:6379/0",
}


def asks_only_for_help(argv: Sequence[str]) -> bool:
    """True when ``manage.py ARGV...`` prints help or the version and runs no command (Django's rules)."""
    args = list(argv[1:])
    if not args or args[0] in TOP_LEVEL_HELP:
        return True
    for arg in args[1:]:
        if arg == "--":
            return False  # what follows is positional, even "--help"
        if arg in HELP_FLAGS:
            return True  # argparse prints the command's help and exits before handle()
    return False


def allow_help_without_services(argv: Sequence[str], environ: MutableMapping[str, str]) -> None:
    """For a help-only command line, placeholder URLs where none is configured (``NAME`` or ``NAME_FILE``)."""
    if not asks_only_for_help(argv):
        return
    for name, placeholder in PLACEHOLDERS.items():
        if name == "REDIS_URL" and (environ.get("KOALA_REDIS_SENTINELS") or "KOALA_REDIS_SENTINELS_FILE" in environ):
            continue  # Redis is configured, by its sentinels (a placeholder URL beside them is refused)
        if not environ.get(name) and f"{name}_FILE" not in environ:
            environ[name] = placeholder
