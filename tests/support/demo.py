"""Running Koala's commands as ``make run`` does, against the test database: the same settings
(DEBUG, the default kinds, the sandbox provider's URL and port), a data folder of the test's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

from tests.conftest import REPO, database_url_for_subprocess


def demo_env(data_dir: Path, *, sandbox_url: str = "", sandbox_port: int | None = None, api_key: str = "") -> dict[str, str]:
    """make run's environment: koala_run sets DEBUG and, for its sandbox, KOALA_SANDBOX_PORT and
    both provider URLs; nothing else is set (default kinds, timeouts, windows)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KOALA_", "DJANGO_"))}
    env.update(
        {
            "DATABASE_URL": database_url_for_subprocess(),
            "REDIS_URL": settings.REDIS_URL,
            "DEBUG": "true",
            "KOALA_DATA_DIR": str(data_dir),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if sandbox_url:
        env |= {"KOALA_PAYMENTS_URL": sandbox_url, "KOALA_MODELS_URL": sandbox_url}
    if sandbox_port is not None:
        env["KOALA_SANDBOX_PORT"] = str(sandbox_port)
    if api_key:
        env |= {"KOALA_PAYMENTS_API_KEY": api_key, "KOALA_MODELS_API_KEY": api_key}
    return env


def manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
