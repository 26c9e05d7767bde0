"""Fixtures for the browser tier: Debian's chromium driven by Playwright (installed in CI,
explained in docs/configuration.md), and where the screenshots go."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

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
    """apt-get install chromium; returns why it could not, or None when it worked (or another
    process installed it meanwhile: under pytest-xdist several workers may want it at once, and
    two apt-gets would fail on dpkg's lock, so they take turns and the later ones find it there)."""
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "not root or no apt-get on this machine"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open("/tmp/koala-install-chromium.lock", "a") as lock:  # one lock for the whole machine
        fcntl.flock(lock, fcntl.LOCK_EX)
        if Path(CHROMIUM).exists():
            return None
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


# Per module, not per session: Playwright's sync API keeps an asyncio loop running on this thread
# for as long as it lives, and while it does, every later test on the thread that calls an async
# view through Django's test client fails ("You cannot use AsyncToSync in the same thread as an
# async event loop"). A parallel run hands browser tests out first, so the rest of a worker's
# tests came after them; the loop ends with the browser tests' module.
@pytest.fixture(scope="module")
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
