"""The subprocess DATABASE_URL (tests/dburl.py) parses back, through koala/settings.py's parser, to the same connection."""

from __future__ import annotations

from typing import Any

import environ
import pytest

from tests.dburl import database_url


def parsed(url: str) -> dict[str, Any]:
    # The parser koala/settings.py uses for DATABASE_URL.
    return environ.Env.db_url_config(url)


@pytest.mark.parametrize(
    "params",
    [
        # The embedded PostgreSQL (devtools.embedded): a unix-socket folder, no TCP host.
        {"HOST": "/tmp/koala-0-3f2a/pg sock", "PORT": 5432, "USER": "postgres", "PASSWORD": "", "NAME": "test_koala"},
        {"HOST": "/home/Dev/.koala-data/postgres", "PORT": "", "USER": "postgres", "PASSWORD": "", "NAME": "test_koala"},
        # The machine's PostgreSQL over TCP, with characters a URL must escape.
        {"HOST": "127.0.0.1", "PORT": 5432, "USER": "root", "PASSWORD": "", "NAME": "test_fresh"},
        {"HOST": "db.internal", "PORT": 6432, "USER": "k@la", "PASSWORD": "p/ss:w@rd%", "NAME": "test_koala"},
        {"HOST": "", "PORT": "", "USER": "", "PASSWORD": "", "NAME": "test_koala"},
    ],
)
def test_url_names_the_same_host_port_database_and_login(params: dict[str, Any]) -> None:
    back = parsed(database_url(params))
    assert back["ENGINE"] == "django.db.backends.postgresql"
    for key in ("HOST", "NAME", "USER", "PASSWORD"):
        assert back[key] == params[key], key
    assert str(back["PORT"]) == str(params["PORT"])


def test_ipv6_host() -> None:
    params = {"HOST": "::1", "PORT": 5432, "USER": "root", "PASSWORD": "", "NAME": "test_koala"}
    back = parsed(database_url(params))
    assert (back["HOST"], back["PORT"], back["NAME"]) == ("::1", 5432, "test_koala")


def test_a_proxy_in_front_of_a_socket_database_replaces_host_and_port_and_adds_options() -> None:
    params = {"HOST": "/tmp/koala-0-3f2a", "PORT": 5432, "USER": "postgres", "PASSWORD": "", "NAME": "test_koala"}
    back = parsed(database_url(params, host="127.0.0.1", port=40123, sslmode="disable"))
    assert (back["HOST"], back["PORT"], back["NAME"], back["USER"]) == ("127.0.0.1", 40123, "test_koala", "postgres")
    assert back["OPTIONS"] == {"sslmode": "disable"}


def test_socket_folder_with_options() -> None:
    params = {"HOST": "/tmp/s", "PORT": 5433, "USER": "postgres", "PASSWORD": "", "NAME": "test_koala"}
    back = parsed(database_url(params, sslmode="disable"))
    assert (back["HOST"], back["PORT"], back["NAME"], back["OPTIONS"]) == ("/tmp/s", 5433, "test_koala", {"sslmode": "disable"})
