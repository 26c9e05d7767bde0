"""The demo's logins, kept in the data folder so the banner (and a person) can find them again.

``$KOALA_DATA_DIR/logins.json`` (default ``.koala-data/logins.json``), written by ``koala_demo``
and read by ``koala_run``'s banner: a JSON list of ``{"username": …, "password": …, "roles": […]}``,
mode 0600. Local demo data only: these passwords guard nothing but the demo database.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

FILENAME = "logins.json"
# The admin password file koala_demo kept before logins.json (read when logins.json is absent).
LEGACY_ADMIN_FILE = "demo-admin-password"


@dataclass(frozen=True)
class Login:
    username: str
    password: str
    roles: tuple[str, ...] = ()


def data_dir() -> Path:
    return Path(os.environ.get("KOALA_DATA_DIR") or settings.BASE_DIR / ".koala-data")


def path(folder: Path | None = None) -> Path:
    return (folder or data_dir()) / FILENAME


def write(logins: list[Login], folder: Path | None = None) -> Path:
    target = path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    # Created 0600 before anything is written: the passwords are never readable by others.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump([{"username": x.username, "password": x.password, "roles": list(x.roles)} for x in logins], handle, indent=2)
        handle.write("\n")
    tmp.replace(target)
    return target


def read(folder: Path | None = None) -> tuple[list[Login], Path | None]:
    """The stored logins and the file they came from; ([], None) when there are none."""
    folder = folder or data_dir()
    source = path(folder)
    try:
        entries = json.loads(source.read_text())
    except FileNotFoundError:
        legacy = folder / LEGACY_ADMIN_FILE
        try:
            return [Login("admin", legacy.read_text().strip(), ("superuser",))], legacy
        except OSError:
            return [], None
    except (OSError, ValueError):
        return [], None
    logins = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not entry.get("username"):
            continue
        roles = entry.get("roles") or ()
        roles = (roles,) if isinstance(roles, str) else tuple(str(r) for r in roles)
        logins.append(Login(str(entry["username"]), str(entry.get("password", "")), roles))
    return logins, source


API_KEY_FILE = "api-key"  # the demo's worker API key (worker + execute scopes), mode 0600


def api_key_path(folder: Path | None = None) -> Path:
    return (folder or data_dir()) / API_KEY_FILE


def write_api_key(raw: str, folder: Path | None = None) -> Path:
    target = api_key_path(folder)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(raw + "\n")
    tmp.replace(target)
    return target


def read_api_key(folder: Path | None = None) -> tuple[str, Path | None]:
    """The demo's stored API key and its file; ("", None) when there is none."""
    source = api_key_path(folder)
    try:
        return source.read_text().strip(), source
    except OSError:
        return "", None
