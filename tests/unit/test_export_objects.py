"""The export's query text and its objects in a folder: keys, owner-only files, a publish that
never replaces, digests and temp listings (a real file system under tmp_path, no services)."""

from __future__ import annotations

import hashlib
import os
import stat
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from django.core.files.storage import FileSystemStorage

from exports.sql import COLUMNS, copy_sql, select_sql, window
from exports.storage import Digest, ExportStore, ObjectExists, output_key_for, temp_key_for, temp_prefix_for


def test_the_window_covers_whole_utc_days_end_exclusive() -> None:
    assert window(date_from=date(2026, 2, 28), date_to=date(2026, 3, 1)) == (
        datetime(2026, 2, 28, tzinfo=UTC),
        datetime(2026, 3, 2, tzinfo=UTC),
    )
    start, end = window(date_from=date(2026, 12, 31), date_to=date(2026, 12, 31))
    assert (end - start).days == 1 and end.year == 2027


def test_the_select_is_parameterised_ordered_and_optionally_limited() -> None:
    sql, params = select_sql(account_id=5, date_from=date(2026, 1, 1), date_to=date(2026, 1, 31))
    assert sql.startswith(f"SELECT {COLUMNS} FROM exports_event WHERE account_id = %(account)s")
    assert sql.endswith("ORDER BY occurred_at, id") and "LIMIT" not in sql
    assert params == {"account": 5, "start": datetime(2026, 1, 1, tzinfo=UTC), "end": datetime(2026, 2, 1, tzinfo=UTC)}
    limited, limited_params = select_sql(account_id=5, date_from=date(2026, 1, 1), date_to=date(2026, 1, 1), limit=10)
    assert limited.endswith("ORDER BY occurred_at, id LIMIT %(limit)s") and limited_params["limit"] == 10
    assert copy_sql(limited) == f"COPY ({limited}) TO STDOUT WITH (FORMAT csv, HEADER)"
    with pytest.raises(ValueError, match="select_sql's statements"):
        copy_sql("SELECT 1")  # any other text: the COPY wraps only the export's own selects


def test_keys_derive_from_the_export_and_the_attempt() -> None:
    assert output_key_for(12) == "exports/12/export-12.csv"
    assert temp_prefix_for(12) == "tmp/12"
    first, second = temp_key_for(12, 3), temp_key_for(12, 3)
    assert first.startswith("tmp/12/3-") and first.endswith(".csv.part") and first != second  # a re-run never collides


@pytest.fixture
def store(tmp_path: Path) -> ExportStore:
    return ExportStore(FileSystemStorage(location=str(tmp_path)))


def _write(store: ExportStore, key: str, data: bytes) -> None:
    handle = store.open_temp(key)
    handle.write(data)
    store.seal(handle)


def test_temp_objects_are_owner_only_and_never_reopened(store: ExportStore, tmp_path: Path) -> None:
    assert store.local
    key = temp_key_for(7, 1)
    _write(store, key, b"a,b\n")
    path = Path(store.storage.path(key))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (tmp_path / "tmp", tmp_path / "tmp" / "7"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    with pytest.raises(FileExistsError):
        store.open_temp(key)  # O_EXCL: an attempt never writes into another's object
    assert store.temp_keys(7) == [key] and store.temp_keys(8) == []


def test_publish_moves_the_bytes_and_never_replaces_an_object(store: ExportStore) -> None:
    first, second = temp_key_for(7, 1), temp_key_for(7, 2)
    _write(store, first, b"id\n1\n")
    _write(store, second, b"id\n2\n")
    final = output_key_for(7)
    store.publish(first, final)
    assert not store.exists(first) and store.exists(final)
    with pytest.raises(ObjectExists):
        store.publish(second, final)
    assert store.exists(second), "a refused publish leaves its temporary object for the cleaner"
    with store.open_final(final) as handle:
        assert handle.read() == b"id\n1\n"
    assert stat.S_IMODE(os.stat(store.storage.path(final)).st_mode) == 0o600


def test_digest_and_delete(store: ExportStore) -> None:
    key = temp_key_for(9, 1)
    data = b"x" * (3 * 1024 * 1024 + 5)  # several read chunks
    _write(store, key, data)
    assert store.digest(key) == Digest(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    store.delete(key)
    store.delete(key)  # deleting what is gone is not an error
    assert store.digest(key) is None and not store.exists(key)
