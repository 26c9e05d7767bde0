"""The ``*_FILE`` path end to end, as the container runs Koala, without Docker (no daemon runs
here): the image's entry point (deploy/docker/entrypoint) and health check
(deploy/docker/readyz.py) from this checkout, with the environment ``docker-compose config``
gives the web and worker services of deploy/compose/compose.yaml. ``/run/secrets/NAME`` is a
folder of mode 0700 whose files are mode 0600: the signing key, the database URL and both
provider keys are there and nowhere else (no secret in the environment, only the ``*_FILE``
paths).

- ``check --deploy`` passes, the web serves and its health check sees /readyz answer 200, a
  worker runs a job;
- a body that logs and raises with the provider keys and the signing key in the text: the
  job's record, the worker's output and the web's log hold none of them;
- a start with an unreadable secret file stops with an error that names the variable and the
  path, and holds no secret.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from django.conf import settings

from devtools.servers import wait_listening
from tests.conftest import database_url_for_subprocess
from tests.support.fleet import free_port
from tests.support.system_tools import require_tool
from workers.models import Attempt, Job

# services: the subprocesses get the test database's URL, in a secret file.
# transaction: the web and the worker (other processes) must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
ENTRYPOINT = str(REPO / "deploy" / "docker" / "entrypoint")
READYZ = str(REPO / "deploy" / "docker" / "readyz.py")
PYTHON = str(REPO / ".venv" / "bin" / "python")


def compose_environment(service: str) -> dict[str, str]:
    """The service's environment as Compose resolves it (anchors merged, ${KOALA_HOST} filled)."""
    tool = require_tool("docker-compose")
    done = subprocess.run(
        [tool, "-f", str(COMPOSE_DIR / "compose.yaml"), "config"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return {k: str(v) for k, v in yaml.safe_load(done.stdout)["services"][service]["environment"].items()}


class Container:
    """One service's process as its container would run it, on this machine."""

    def __init__(self, root: Path, secrets_dir: Path, service: str, port: int) -> None:
        self.root = root
        data = root / "data"
        data.mkdir(parents=True, exist_ok=True)
        env: dict[str, str] = {}
        for name, value in compose_environment(service).items():
            if value.startswith("/run/secrets/"):
                value = str(secrets_dir / value.removeprefix("/run/secrets/"))
            env[name] = value
        assert env["REDIS_URL"].startswith("redis://redis:"), "the Compose network's Redis, replaced below"
        env.update(
            REDIS_URL=settings.REDIS_URL,
            KOALA_DATA_DIR=str(data),
            KOALA_EXPORT_ROOT=str(data / "exports"),
            # The image's ENV (Dockerfile), moved to this checkout and this test.
            STATIC_ROOT=str(data / "static"),
            PYTHONUNBUFFERED="1",
            PYTHONDONTWRITEBYTECODE="1",
            KOALA_HOME=str(REPO),
            KOALA_PORT=str(port),
            PATH="/usr/local/bin:/usr/bin:/bin",
            HOME=str(data),
            LANG="C.UTF-8",
            KOALA_JOB_KIND_MODULES="workers.builtin_kinds,tests.leak_kinds",
        )
        self.env = env

    def run(self, *args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*(prefix or []), ENTRYPOINT, *args], env=self.env, capture_output=True, text=True, timeout=180, check=False
        )


@pytest.fixture
def secret_values(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The secrets folder (0700) with one 0600 file per secret; and the values."""
    folder = tmp_path / "run-secrets"
    folder.mkdir(mode=0o700)
    values = {
        "secret_key": secrets.token_urlsafe(50),
        "payments_api_key": "pay-" + secrets.token_urlsafe(24),
        "models_api_key": "mod-" + secrets.token_urlsafe(24),
        "metrics_token": "met-" + secrets.token_urlsafe(24),
        "database_url": database_url_for_subprocess(),
    }
    for name, value in values.items():
        path = folder / name
        path.write_text(value + "\n")
        path.chmod(0o600)
    yield folder, values


def secrets_in(text: str, values: dict[str, str]) -> list[str]:
    """Which secret values (the database URL only if it holds a password) appear in ``text``."""
    shown = [name for name, value in values.items() if name != "database_url" and value in text]
    if "@" in values["database_url"] and ":" in values["database_url"].split("@")[0].removeprefix("postgres://"):
        password = values["database_url"].split("@")[0].rsplit(":", 1)[1]
        if password in text:
            shown.append("database_url")
    return shown


def test_koala_runs_with_its_secrets_only_in_files_and_shows_none_of_them(
    tmp_path: Path, secret_values: tuple[Path, dict[str, str]]
) -> None:
    folder, values = secret_values
    port = free_port()
    web = Container(tmp_path / "web", folder, "web", port)
    worker = Container(tmp_path / "worker", folder, "worker", port)
    for container in (web, worker):
        assert not [k for k in container.env if k in {"SECRET_KEY", "DATABASE_URL", "KOALA_PAYMENTS_API_KEY"}]
        assert not secrets_in(json.dumps(container.env), values), "the environment holds no secret, only paths"
    assert {"KOALA_PAYMENTS_API_KEY_FILE", "KOALA_MODELS_API_KEY_FILE"} <= set(worker.env)

    # The deployment check, with every secret read from its file.
    checked = web.run("manage", "check", "--deploy", "--fail-level", "WARNING")
    assert checked.returncode == 0, checked.stderr
    assert "System check identified no issues (0 silenced)." in checked.stdout

    log = open(tmp_path / "web.log", "wb")
    server = subprocess.Popen([ENTRYPOINT, "web"], env=web.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    outputs: list[str] = []
    try:
        assert wait_listening(server, port, timeout=60), (tmp_path / "web.log").read_text()[-3000:]
        # The image's HEALTHCHECK, as Docker runs it in the web's container.
        probe = subprocess.run([PYTHON, READYZ], env=web.env, capture_output=True, text=True, timeout=30, check=False)
        assert (probe.returncode, probe.stdout.strip()) == (0, "readyz: 200; database ok; redis ok; migrations ok"), probe
        # /metrics wants the token read from its file: refused without it, served with it.
        # (The Host a proxy would forward, as readyz.py sends it; 127.0.0.1 is not an allowed host.)
        metrics = f"http://127.0.0.1:{port}/metrics"
        host = {"Host": web.env["ALLOWED_HOSTS"].split(",")[0], "X-Forwarded-Proto": "https"}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(metrics, headers=host), timeout=30)
        assert refused.value.code == 401
        asked = urllib.request.Request(metrics, headers={**host, "Authorization": f"Bearer {values['metrics_token']}"})
        with urllib.request.urlopen(asked, timeout=30) as answer:
            assert answer.status == 200 and b"koala_up 1" in answer.read()

        # A job that works, and a body that logs and raises with the secrets in its text.
        ok = int(worker.run("manage", "koala_enqueue", "noop", "--input", "{}").stdout.strip())
        leak = worker.run("manage", "koala_enqueue", "test.secret_leak", "--input", "{}")
        assert leak.returncode == 0, leak.stderr
        leaked_job = int(leak.stdout.strip())
        ran = worker.run("worker", "--burst", "--name", "container-secrets-test")
        assert ran.returncode == 0, ran.stderr[-3000:]
        outputs.append(ran.stdout + ran.stderr)
        assert Job.objects.get(pk=ok).state == "succeeded"
        assert Job.objects.get(pk=leaked_job).state == "failed"
        shown = worker.run("manage", "koala_job", str(leaked_job), "--json")
        assert shown.returncode == 0, shown.stderr
        outputs.append(shown.stdout + shown.stderr)
        assert "provider refused key [redacted]" in shown.stdout, shown.stdout
        assert "calling the provider with key [redacted] (models [redacted])" in ran.stdout + ran.stderr
        probe = subprocess.run([PYTHON, READYZ], env=web.env, capture_output=True, text=True, timeout=30, check=False)
        outputs.append(probe.stdout + probe.stderr)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()
    outputs.append((tmp_path / "web.log").read_text(errors="replace"))
    # Everything Koala stored about the failure, as the database holds it.
    record = Job.objects.get(pk=leaked_job)
    outputs.append(json.dumps([str(getattr(record, f.attname)) for f in Job._meta.concrete_fields]))
    for attempt in Attempt.objects.filter(job_id=leaked_job):
        outputs.append(json.dumps([str(getattr(attempt, f.attname)) for f in type(attempt)._meta.concrete_fields]))
    for text in outputs:
        assert not secrets_in(text, values), f"{secrets_in(text, values)} shown in:\n{text[-3000:]}"


@pytest.mark.parametrize(
    ("service", "secret", "variable"),
    [("web", "secret_key", "SECRET_KEY_FILE"), ("worker", "payments_api_key", "KOALA_PAYMENTS_API_KEY_FILE")],
)
def test_an_unreadable_secret_file_stops_start_up_naming_the_variable_and_no_secret(
    tmp_path: Path, secret_values: tuple[Path, dict[str, str]], service: str, secret: str, variable: str
) -> None:
    """A secret mounted with the wrong owner (Compose keeps the host file's): the process cannot
    read it and says which one, without printing any secret it could read."""
    folder, values = secret_values
    container = Container(tmp_path / service, folder, service, free_port())
    target = folder / secret
    # Someone else's file of mode 0600 (what Compose mounts when the host file's owner is not
    # the container's user). As root, the process loses the capabilities that read any file.
    prefix: list[str] = []
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)
        prefix = [require_tool("setpriv"), "--bounding-set=-dac_override,-dac_read_search"]
    else:
        target.chmod(0)
    done = container.run("manage", "check", prefix=prefix)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert said.strip() == f"Koala configuration error: {variable}={str(target)!r} cannot be read: Permission denied", said
    assert not secrets_in(said, values), said
    # The same start from the worker role (the container's command): the same error.
    role = container.run(service, prefix=prefix)
    assert role.returncode == 2 and f"{variable}=" in role.stderr and not secrets_in(role.stdout + role.stderr, values)
