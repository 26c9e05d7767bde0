"""docs/operations.md's SQL runs as written: the autovacuum settings for the job tables, and the
restore's sequence move (ids made after a dump are never handed out again)."""

from __future__ import annotations

import pytest
from django.db import connection

from tests.support.doc_commands import REPO, blocks

pytestmark = pytest.mark.django_db

OPERATIONS = REPO / "docs" / "operations.md"


def sql_blocks() -> dict[str, str]:
    """Each ```sql block of docs/operations.md by the section it is in."""
    found: dict[str, str] = {}
    lines = OPERATIONS.read_text().splitlines()
    for block in blocks(OPERATIONS):
        if block.language != "sql":
            continue
        heading = next(line for line in reversed(lines[: block.line]) if line.startswith("#"))
        found[heading.lstrip("# ")] = "\n".join(block.lines)
    return found


def statements(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def test_the_documents_sql_blocks_are_found() -> None:
    assert set(sql_blocks()) == {"Autovacuum for the job tables", "Backup and restore"}


def test_the_autovacuum_settings_apply_to_the_job_tables() -> None:
    with connection.cursor() as cursor:
        for statement in statements(sql_blocks()["Autovacuum for the job tables"]):
            cursor.execute(statement)
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'workers_job'")
        assert "autovacuum_vacuum_scale_factor=0.01" in cursor.fetchone()[0]


def test_the_restores_sequence_move_skips_every_id_made_since_the_dump() -> None:
    from workers import enqueue

    made = enqueue(kind="noop", input={}).job_id
    with connection.cursor() as cursor:
        for statement in statements(sql_blocks()["Backup and restore"]):
            cursor.execute(statement)
    after = enqueue(kind="noop", input={}).job_id
    assert after >= made + 10_000_000
