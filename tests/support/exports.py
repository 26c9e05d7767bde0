"""Fixtures for the export tests: people and accounts, demo events, a private export folder,
and environments for real worker subprocesses (the in-process drain is tests.inprocess.run_export)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection

from exports.demo_data import generate_events
from exports.models import Account, Export
from exports.services import request_export
from exports.streaming import connection_params
from tests.conftest import worker_env

# The export's query, written out here rather than imported, so the tests check the job
# against SQL they state themselves.
SOURCE_SQL = (
    "COPY (SELECT id, occurred_at, event_type, user_ref, amount_minor, currency, country, detail "
    "FROM exports_event WHERE account_id = {account} AND occurred_at >= '{start} 00:00:00+00' "
    "AND occurred_at < '{end} 00:00:00+00'::timestamptz + interval '1 day' ORDER BY occurred_at, id) "
    "TO STDOUT WITH (FORMAT csv, HEADER)"
)
YEAR = (date(2026, 1, 1), date(2026, 12, 31))
FAULTS_MODULES = "workers.builtin_kinds,tests.kinds,exports.jobs,tests.support.export_faults"


@dataclass
class People:
    alice: User  # member of acme
    bob: User  # member of globex
    mallory: User  # member of nothing
    root: User  # superuser
    acme: Account
    globex: Account


@pytest.fixture
def export_root(tmp_path: Path, settings: Any) -> Path:
    """The "exports" storage points at a fresh folder for this test (this process and workers)."""
    root = tmp_path / "export-storage"
    root.mkdir()
    settings.KOALA_EXPORT_ROOT = root
    settings.STORAGES = {
        **settings.STORAGES,
        "exports": {
            **settings.STORAGES["exports"],
            "OPTIONS": {**settings.STORAGES["exports"]["OPTIONS"], "location": str(root)},
        },
    }
    return root


@pytest.fixture
def people(db: None) -> People:
    accounts = {slug: Account.objects.create(slug=slug, name=slug.title()) for slug in ("acme", "globex")}
    # No passwords (hashing them costs a second per test); browser tests use force_login.
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    mallory = User.objects.create_user("mallory")
    root = User.objects.create_superuser("root")
    accounts["acme"].members.add(alice)
    accounts["globex"].members.add(bob)
    return People(alice, bob, mallory, root, accounts["acme"], accounts["globex"])


def request(people: People, **options: Any) -> Export:
    """Alice's export of acme's year, unless options say otherwise."""
    options.setdefault("user", people.alice)
    options.setdefault("account_id", people.acme.pk)
    options.setdefault("date_from", YEAR[0])
    options.setdefault("date_to", YEAR[1])
    return request_export(**options)


def load_events(*accounts: Account, rows: int, seed: int = 7) -> None:
    generate_events(rows=rows, accounts=list(accounts), seed=seed)


def direct_copy(account: Account, date_from: date = YEAR[0], date_to: date = YEAR[1]) -> bytes:
    """The physical source: the same query through a plain COPY on a connection of its own."""
    sql = SOURCE_SQL.format(account=int(account.pk), start=date_from.isoformat(), end=date_to.isoformat())
    chunks: list[bytes] = []
    with psycopg.connect(**connection_params(), autocommit=True) as conn, conn.cursor() as cursor:
        with cursor.copy(sql) as copy:
            for data in copy:
                chunks.append(bytes(data))
    return b"".join(chunks)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def published(root: Path) -> list[Path]:
    return sorted(p for p in (root / "exports").rglob("*") if p.is_file()) if (root / "exports").exists() else []


def temp_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "tmp").rglob("*") if p.is_file()) if (root / "tmp").exists() else []


@dataclass
class Faults:
    """The instruction file that tests.support.export_faults follows inside the workers."""

    path: Path
    log: Path

    def set(self, **config: Any) -> None:
        self.path.write_text(json.dumps({"log": str(self.log), **config}))

    def lines(self, what: str, export_id: int | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        found = [line.split() for line in self.log.read_text().splitlines() if line.strip()]
        return [f for f in found if f[0] == what and (export_id is None or f[1] == str(export_id))]

    def phases(self, export_id: int) -> list[tuple[int, str]]:
        return [(int(f[2]), f[3]) for f in self.lines("phase", export_id)]


@pytest.fixture
def faults(tmp_path: Path) -> Faults:
    made = Faults(path=tmp_path / "faults.json", log=tmp_path / "export-effects.log")
    made.set()
    return made


@pytest.fixture
def export_env(export_root: Path, faults: Faults) -> Iterator[dict[str, str]]:
    """Environment for worker/beat subprocesses: this test's database, storage and fault hooks."""
    yield worker_env(
        KOALA_JOB_KIND_MODULES=FAULTS_MODULES,
        KOALA_EXPORT_ROOT=str(export_root),
        KOALA_TEST_EXPORT_FAULTS=str(faults.path),
        KOALA_EXPORT_BATCH_ROWS="5000",
    )


def row_count(data: bytes) -> int:
    """CSV rows after the header (the demo data has no line breaks inside fields)."""
    return data.count(b"\n") - 1


def database_backends(application_name: str) -> list[int]:
    """Backends of this test database with that application_name. pg_stat_activity is server-wide:
    another xdist worker's database has exports with the same ids, hence the same names."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
            [application_name],
        )
        return [row[0] for row in cursor.fetchall()]
