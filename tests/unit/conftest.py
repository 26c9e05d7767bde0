"""The unit tier runs without a database: pure code only (the outcome decision, kinds, redaction…).

pytest-django already refuses database access to a test without the ``django_db`` mark; this
refuses the mark itself (and the fixtures that ask for a database) here, so nothing in this tier
can make ``pytest tests/unit`` create or need the test database. Any well-formed DATABASE_URL
will do (``make unit`` passes a placeholder when it is unset): nothing connects.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DATABASE_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback", "live_server"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        wants = DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("django_db") is not None or wants:
            raise pytest.UsageError(f"{item.nodeid}: tests/unit runs without a database; move it to tests/integration")
