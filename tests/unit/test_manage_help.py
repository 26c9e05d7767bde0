"""`manage.py help` and `manage.py COMMAND --help` need no services; real commands still refuse to start without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KOALA_COMMANDS = sorted(
    path.stem for path in REPO.glob("*/management/commands/koala_*.py") if path.parent.parent.parent.parent == REPO
)
pytestmark = pytest.mark.slow  # every test runs manage.py in a subprocess


def manage_without_services(*args: str) -> subprocess.CompletedProcess[str]:
    """manage.py as on a fresh clone: no DATABASE_URL, REDIS_URL (nor their *_FILE), DEBUG or SECRET_KEY."""
    unset = ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(unset) and not k.startswith("KOALA_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("args", [[], ["help"], ["--help"], ["-h"], ["help", "--commands"]])
def test_help_lists_koala_commands_without_services(args: list[str]) -> None:
    result = manage_without_services(*args)
    assert result.returncode == 0, result.stderr
    assert "koala_worker" in result.stdout and "koala_export" in result.stdout, result.stdout
    assert "configuration error" not in result.stderr


def test_every_koala_command_has_help_without_services() -> None:
    assert len(KOALA_COMMANDS) >= 15, KOALA_COMMANDS
    for command in KOALA_COMMANDS:
        for args in ([command, "--help"], ["help", command]):
            result = manage_without_services(*args)
            assert result.returncode == 0, (args, result.stderr)
            assert f"manage.py {command}" in result.stdout, (args, result.stdout)


def test_version_without_services() -> None:
    result = manage_without_services("version")
    assert result.returncode == 0 and result.stdout.strip()[0].isdigit(), result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["koala_jobs"],
        ["migrate"],
        # "--help" as an option's value or after "--" is not a request for help.
        ["shell", "-c", "print('--help')"],
        ["koala_enqueue", "noop", "--", "--help"],
    ],
)
def test_a_real_command_still_refuses_to_start_without_a_database_url(args: list[str]) -> None:
    result = manage_without_services(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "DATABASE_URL is not set" in result.stderr
    assert "Traceback" not in result.stderr
