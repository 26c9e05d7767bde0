"""A DATABASE_URL for a subprocess, built from a connection's settings dict (the test database)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode


def database_url(params: dict[str, Any], *, host: str | None = None, port: int | str | None = None, **query: str) -> str:
    """The URL koala/settings.py (django-environ) parses back into the same HOST, PORT, NAME, USER, PASSWORD.

    ``host``/``port`` replace the connection's (a proxy in front of it); ``query`` adds libpq options.
    """
    user = quote(params.get("USER") or "", safe="")
    password = params.get("PASSWORD") or ""
    auth = f"{user}:{quote(password, safe='')}@" if password else (f"{user}@" if user else "")
    if host is None:
        host = params.get("HOST") or ""
    if port is None:
        port = params.get("PORT") or ""
    name = params["NAME"]
    netport = f":{port}" if port else ""
    suffix = f"?{urlencode(query)}" if query else ""
    if host.startswith("/"):
        # A unix-socket folder (the embedded PostgreSQL) cannot stand where a host name goes: psycopg
        # would resolve "%2Ftmp%2F…" as a DNS name. django-environ reads a path of the form
        # /<encoded folder>/<database> as HOST=<folder>, NAME=<database>; the port stays in the netloc.
        if "/" in name:
            raise ValueError(f"database name {name!r} cannot follow a socket folder in a URL")
        return f"postgres://{auth}{netport}/{quote(host, safe='')}/{quote(name, safe='')}{suffix}"
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    return f"postgres://{auth}{quote(host, safe='[]:')}{netport}/{quote(name, safe='')}{suffix}"


def libpq_params(params: dict[str, Any]) -> dict[str, Any]:
    """psycopg.connect() keywords for a connection's settings dict (HOST may be a socket folder:
    libpq reads it as one only as ``host=``, never inside a URL's path as Koala's URLs put it)."""
    found = {
        "host": params.get("HOST") or None,
        "port": params.get("PORT") or None,
        "user": params.get("USER") or None,
        "password": params.get("PASSWORD") or None,
        "dbname": params["NAME"],
    }
    return {key: value for key, value in found.items() if value is not None}


def libpq_params_of(url: str) -> dict[str, Any]:
    """psycopg.connect() keywords for one of Koala's DATABASE_URLs (database_url's form)."""
    import environ

    return libpq_params(environ.Env.db_url_config(url))
