"""API keys for tests: made through the real service (api.keys.create_key)."""

from __future__ import annotations

from typing import Any

from api.keys import create_key


def new_key(*scopes: str, person: str = "", name: str = "test key", **extra: Any) -> tuple[Any, str]:
    return create_key(name=name, scopes=scopes or ("execute",), actor="setup", person=person, **extra)


def bearer(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
