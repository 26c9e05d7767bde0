"""A management command beside `make run` (scripts/manage, `make manage`) reaches make run's database and Redis db.

Each launcher of devtools.embedded normally gets its own Redis database number (so `make test`
never flushes `make run`'s doorbells); a command run beside `make run` must instead share its
number, or its doorbell rings where no worker listens. Real launchers, real embedded services,
in a private data folder; `make run` is stood in for by a launcher of role "run" whose child
prints the environment it was given and waits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

PRINT_ENV_AND_WAIT = (
    "import json, os, sys; "
    "print(json.dumps({k: os.environ.get(k) for k in ('DATABASE_URL', 'REDIS_URL', 'KOALA_EMBEDDED_REDIS_DBS')}), flush=True); "
    "sys.stdin.read()"
)
SETTINGS_AS_JSON = (
    "import json; from django.conf import settings; from django.db import connection; "
    "print(json.dumps({'REDIS_URL': settings.REDIS_URL, 'NAME': settings.DATABASES['default']['NAME'], "
    "'DEBUG': settings.DEBUG, 'database': connection.cursor().execute('SELECT current_database()').fetchone()[0]}))"
)


@pytest.fixture
def fresh_env() -> Iterator[dict[str, str]]:
    """The environment of a fresh clone (no URLs, no DEBUG/SECRET_KEY) with a private data folder."""
    # Short and under /tmp: the sockets live in it (devtools.embedded keeps socket paths short).
    data_dir = Path(tempfile.mkdtemp(prefix="koala-beside-", dir="/tmp"))
    unset = ("DATABASE_URL", "REDIS_URL", "PG", "DEBUG", "SECRET_KEY", "KOALA_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    env["KOALA_DATA_DIR"] = str(data_dir)
    try:
        yield env
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


class Launcher:
    """``python -m devtools.embedded [OPTIONS] -- python -c PRINT_ENV_AND_WAIT``, held open until closed."""

    def __init__(self, env: dict[str, str], *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.embedded", *options, "--", sys.executable, "-c", PRINT_ENV_AND_WAIT],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"launcher {options} exited with {self.proc.wait()}"
        self.env: dict[str, str] = json.loads(line)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


def redis_db(url: str) -> int:
    from redis.connection import parse_url

    return int(parse_url(url).get("db", 0))


def beside(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(REPO / "scripts" / "manage"), *args], cwd="/", env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_scripts_manage_joins_the_run_launchers_database_and_redis_db(fresh_env: dict[str, str]) -> None:
    launchers: list[Launcher] = []
    try:
        # Another launcher first (a `make test` in a second terminal) holds the first free Redis db.
        test_run = Launcher(fresh_env)
        launchers.append(test_run)
        make_run = Launcher({**fresh_env, "KOALA_EMBEDDED_DATABASE": "demo_beside"}, "--role", "run")
        launchers.append(make_run)
        assert redis_db(make_run.env["REDIS_URL"]) != redis_db(test_run.env["REDIS_URL"])

        # From another folder, without KOALA_EMBEDDED_DATABASE: everything comes from the run launcher.
        seen = beside(fresh_env, "shell", "-c", SETTINGS_AS_JSON)
        assert seen["REDIS_URL"] == make_run.env["REDIS_URL"]
        assert seen["NAME"] == seen["database"] == "demo_beside"
        assert seen["DEBUG"] is True  # make run's development settings

        # Without --join a launcher gets a Redis db of its own: joining is what made them equal.
        alone = Launcher(fresh_env)
        launchers.append(alone)
        assert redis_db(alone.env["REDIS_URL"]) not in {redis_db(make_run.env["REDIS_URL"]), redis_db(test_run.env["REDIS_URL"])}
    finally:
        codes = [launcher.close() for launcher in reversed(launchers)]
    assert codes == [0] * len(launchers)


def test_make_test_reserves_a_redis_db_per_parallel_worker_and_make_run_keeps_its_own(fresh_env: dict[str, str]) -> None:
    # Redis alone: DATABASE_URL is set (nothing connects to it), so no PostgreSQL is started.
    env = {**fresh_env, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/unused"}
    launchers: list[Launcher] = []
    try:
        make_test = Launcher({**env, "KOALA_EMBEDDED_REDIS_DBS": "6"})  # what `make test` (6 workers) asks for
        launchers.append(make_test)
        first = redis_db(make_test.env["REDIS_URL"])
        assert make_test.env["KOALA_EMBEDDED_REDIS_DBS"] == "6"  # the tests' bound on their workers
        make_run = Launcher(env, "--role", "run")
        launchers.append(make_run)
        assert redis_db(make_run.env["REDIS_URL"]) not in range(first, first + 6)
        another = Launcher({**env, "KOALA_EMBEDDED_REDIS_DBS": "6"})  # a second `make test` beside both
        launchers.append(another)
        second = redis_db(another.env["REDIS_URL"])
        assert not set(range(second, second + 6)) & {*range(first, first + 6), redis_db(make_run.env["REDIS_URL"])}
    finally:
        codes = [launcher.close() for launcher in reversed(launchers)]
    assert codes == [0] * len(launchers)


def test_without_an_embedded_redis_no_reservation_reaches_the_command(fresh_env: dict[str, str]) -> None:
    # REDIS_URL set: the tests' bound on their workers must not come from a reservation nobody made.
    env = {**fresh_env, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/unused", "REDIS_URL": "redis://127.0.0.1:1/0"}
    launcher = Launcher({**env, "KOALA_EMBEDDED_REDIS_DBS": "6"})
    assert launcher.close() == 0
    assert launcher.env == {"DATABASE_URL": env["DATABASE_URL"], "REDIS_URL": env["REDIS_URL"], "KOALA_EMBEDDED_REDIS_DBS": None}


@pytest.mark.parametrize("value", ["17", "x", "-1"])
def test_a_bad_redis_db_count_is_refused_before_anything_starts(fresh_env: dict[str, str], value: str) -> None:
    env = {**fresh_env, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/unused", "KOALA_EMBEDDED_REDIS_DBS": value}
    done = subprocess.run(
        [sys.executable, "-m", "devtools.embedded", "--", sys.executable, "-c", "print('ran')"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    assert f"KOALA_EMBEDDED_REDIS_DBS={value!r} is not a number from 0 to 16" in done.stderr
    assert not (Path(env["KOALA_DATA_DIR"]) / "redis" / "redis.pid").exists()


def test_scripts_manage_without_a_running_make_run_uses_the_default_database(fresh_env: dict[str, str]) -> None:
    seen = beside(fresh_env, "shell", "-c", SETTINGS_AS_JSON)
    assert seen["NAME"] == seen["database"] == "koala"
    assert seen["DEBUG"] is True
