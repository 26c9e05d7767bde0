"""Koala's migrations are backward compatible with the release before them (expand only), because
an upgrade migrates while the old web, workers and beat still run (docs/operations.md, "Upgrading").

The old release's statements must keep working on the migrated schema:
- a new column is nullable or has a database default (``db_default=``): the old code's INSERTs
  do not name it. Django's ``default=`` alone is not one: Django fills the existing rows with it
  and then drops it from the column;
- an existing column never becomes NOT NULL without a database default;
- nothing the old code reads or writes is removed or renamed in the same release that stops
  using it: that is a later release's contract step, and its migration says so in ``CONTRACT``
  (a module-level string naming the release that stopped using it).

Migrations written before this rule are listed below, each with what it means for an upgrade
across it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from django.db import migrations
from django.db.migrations.loader import MigrationLoader
from django.db.models import NOT_PROVIDED

# The apps whose migrations Koala ships (their labels).
KOALA_APPS = {
    "koala", "workers", "effects", "reviews", "console", "exports", "api", "devtools", "flows", "traces", "schedules", "metrics",
}  # fmt: skip
REMOVING = (
    migrations.RemoveField,
    migrations.DeleteModel,
    migrations.RenameField,
    migrations.RenameModel,
    migrations.AlterModelTable,
)
# NOT NULL columns added with a Python default only, before this rule. While the release before
# each one still runs, its INSERTs into that table fail: jobs (0002: enqueueing on an old web or
# command), worker rows (0004, 0008, 0012: an old worker starting under a name not seen before),
# API keys (api 0002). docs/operations.md, "Upgrading", says what to do across them.
BEFORE_THE_RULE = {
    ("workers", "0002_safety_layer"): {"park_detail", "parked_on"},
    ("workers", "0004_worker_recent_starts"): {"recent_starts"},
    ("workers", "0008_worker_exits"): {"exit", "recent_exits"},
    ("workers", "0012_http_workers"): {"api_key", "concurrency"},
    ("api", "0002_key_limits"): {"kinds", "queues"},
}


def _has_database_default(field: Any) -> bool:
    return field.null or field.db_default is not NOT_PROVIDED or field.many_to_many


def problems() -> list[str]:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    found: list[str] = []
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if app not in KOALA_APPS:
            continue
        where = f"{app}/migrations/{name}.py"
        allowed = BEFORE_THE_RULE.get((app, name), set())
        contract = getattr(importlib.import_module(type(migration).__module__), "CONTRACT", "")
        before = loader.project_state((app, name), at_end=False)
        for op in migration.operations:
            new_table = (app, getattr(op, "model_name_lower", "")) not in before.models  # no old code writes it
            if isinstance(op, migrations.AddField) and not new_table and not _has_database_default(op.field):
                if op.name in allowed:
                    continue
                found.append(f"{where}: {op.model_name}.{op.name} is NOT NULL without db_default (old INSERTs fail)")
            elif isinstance(op, migrations.AlterField) and not new_table and not _has_database_default(op.field):
                old = before.models[app, op.model_name_lower].fields.get(op.name)
                if old is not None and _has_database_default(old):
                    found.append(f"{where}: {op.model_name}.{op.name} becomes NOT NULL without db_default")
            elif isinstance(op, REMOVING) and not contract:
                found.append(f"{where}: {type(op).__name__} removes what the old release uses; a contract step needs CONTRACT")
    return found


def test_every_migration_keeps_the_release_before_it_working() -> None:
    assert problems() == []


def test_the_rule_names_each_column_added_without_a_database_default() -> None:
    """The listed exceptions are real, and complete: without the list, the rule names exactly them."""
    saved = dict(BEFORE_THE_RULE)
    BEFORE_THE_RULE.clear()
    try:
        named = problems()
    finally:
        BEFORE_THE_RULE.update(saved)
    pattern = re.compile(r"^(\w+)/migrations/(\w+)\.py: \w+\.(\w+) is NOT NULL without db_default")
    found: dict[tuple[str, str], set[str]] = {}
    for problem in named:
        match = pattern.match(problem)
        assert match, problem
        found.setdefault((match[1], match[2]), set()).add(match[3])
    assert found == saved
