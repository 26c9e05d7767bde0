"""Fixtures for the console tests: one staff user per role, logged-in clients, and the
browser set-up (Debian's chromium driven by Playwright; installed in CI, explained elsewhere)."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.test import Client

from tests.conftest import REPO

PASSWORD = "console-test-password-9f3a"  # test users only
ROLES = ("operators", "reviewers", "auditors")


def make_user(username: str, *groups: str, staff: bool = True) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=staff)
    user.groups.add(*Group.objects.filter(name__in=groups))
    return user


def ensure_roles() -> None:
    """Re-run the roles migrations' own code: a transactional test's flush empties auth_group."""
    importlib.import_module("console.migrations.0001_roles").create_roles(apps, None)
    importlib.import_module("console.migrations.0002_safety_layer_roles").grant(apps, None)
    importlib.import_module("console.migrations.0003_exports_read_roles").grant(apps, None)


@pytest.fixture
def role_users(db: None, settings: Any) -> dict[str, User]:
    """operator, reviewer, auditor (one group each), and a staff user with no role. Committed
    or not as the test's own django_db mark says (``db`` follows the mark)."""
    # A real but fast hasher for these test-only passwords (the default costs ~0.3 s a user);
    # the browser tests still log in through the login form with them.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    ensure_roles()
    return {
        "operator": make_user("olga", "operators"),
        "reviewer": make_user("rita", "reviewers"),
        "auditor": make_user("aude", "auditors"),
        "norole": make_user("nora"),
    }


@pytest.fixture
def clients(role_users: dict[str, User]) -> dict[str, Client]:
    logged_in = {}
    for role, user in role_users.items():
        client = Client()
        client.force_login(user)
        logged_in[role] = client
    logged_in["anonymous"] = Client()
    return logged_in


# -- the browser ---------------------------------------------------------------------------------

CHROMIUM = os.environ.get("KOALA_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOW_TO_INSTALL = (
    "the browser tests drive Debian's chromium through Playwright for Python. Install it with "
    "`apt-get install -y chromium` (as root; never `playwright install`, which downloads a browser), "
    "or point KOALA_CHROMIUM at a Chromium binary. In CI (CI=true) or with KOALA_INSTALL_BROWSER=1 "
    "the tests install it themselves."
)


def _install_chromium() -> str | None:
    """apt-get install chromium; returns why it could not, or None when it worked."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root or no apt-get on this machine"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {done.stderr.strip()[-500:]}"
    return None


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not Path(CHROMIUM).exists():
        wanted = os.environ.get("CI", "").lower() in {"1", "true", "yes"} or os.environ.get("KOALA_INSTALL_BROWSER") == "1"
        if not wanted:
            pytest.skip(f"Chromium not found at {CHROMIUM}: {HOW_TO_INSTALL}")
        why = _install_chromium()
        if why or not Path(CHROMIUM).exists():
            # CI must run these tests: a machine that cannot get the browser is a failure, not a skip.
            pytest.fail(f"could not install chromium ({why or 'installed, but not at ' + CHROMIUM}): {HOW_TO_INSTALL}")
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium_path: str) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is missing: it is in requirements/dev.txt (run scripts/bootstrap)"
    )
    # Playwright's sync API keeps an asyncio loop on this thread; Django then refuses ORM calls
    # from it unless told that this test thread is synchronous code (it is: Playwright only
    # switches to its loop inside its own calls).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
            try:
                yield launched
            finally:
                launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    """Where the browser tests save their screenshots (KOALA_SCREENSHOT_DIR; .koala-data/ by default)."""
    directory = Path(os.environ.get("KOALA_SCREENSHOT_DIR") or REPO / ".koala-data" / "screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


# -- the outside world ---------------------------------------------------------------------------
# The loopback payment/model provider and its worker environment, shared with tests/effects.
from tests.effects.conftest import PROVIDER_API_KEY, effects_env, provider  # noqa: E402, F401

# The export fixtures (accounts alice/bob/mallory/root, a private storage folder) for the Exports
# page tests; test_browser.py's own "people" fixture overrides this one in that module.
from tests.exports.conftest import export_root, people  # noqa: E402, F401
