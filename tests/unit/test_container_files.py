"""The container files as data and as Debian's docker-compose 1.29.2 reads them (no Docker daemon
runs here, so nothing is built or started; tests/acceptance/test_container_secrets.py runs the
image's entry point and health check on this machine instead):

- ``docker-compose config`` accepts deploy/compose/compose.yaml and refuses a broken copy;
- with secret files holding known values, ``config`` prints none of them (it names the files);
- what ``up`` would give each container: Compose's own translation of the file (its memory and
  CPU limits, its bounded restart, the workers' replicas), read with Compose's own code;
- the Dockerfile: a non-root user, ``--require-hashes``, a HEALTHCHECK on /readyz, no ``.env``
  or secret copied, and .dockerignore keeps secrets and local state out of the build context;
- deploy/compose/make-secrets writes each secret once, mode 0400, with the database password
  shared by the two files that need it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.system_tools import require_tool

# Starts docker-compose and make-secrets.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
SECRET_FILES = ("secret_key", "database_url", "postgres_password", "payments_api_key", "models_api_key", "metrics_token")
KOALA_SERVICES = ("migrate", "web", "worker", "beat")


def compose(*args: str, folder: Path = COMPOSE_DIR, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    tool = require_tool("docker-compose")
    return subprocess.run(
        [tool, "--project-directory", str(folder), "-f", str(folder / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )


def copy_of_compose(tmp_path: Path) -> Path:
    """deploy/compose copied with its build context next to it (the file names ../..)."""
    root = tmp_path / "repo"
    (root / "deploy").mkdir(parents=True)
    shutil.copytree(COMPOSE_DIR, root / "deploy" / "compose")
    shutil.copy(DOCKERFILE, root / "Dockerfile")
    return root / "deploy" / "compose"


def shipped() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


# -- docker-compose config ------------------------------------------------------------------------
def test_docker_compose_config_accepts_the_shipped_file() -> None:
    done = compose("config", "--quiet")
    assert done.returncode == 0, done.stderr
    done = compose("config", "--services")
    assert set(done.stdout.split()) == {"postgres", "redis", *KOALA_SERVICES}, done.stdout


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("condition: service_healthy", "condition: service_healthyy", "service_healthyy"),
        ("    stop_grace_period: 75s", "    stop_grace_periode: 75s", "stop_grace_periode"),
        ("replicas: 2", "replicas: two", "not a valid integer"),
        ("    healthcheck:\n      test:", "    healthcheck:\n      tests:", "tests"),
    ],
)
def test_docker_compose_config_refuses_a_broken_copy(tmp_path: Path, old: str, new: str, said: str) -> None:
    folder = copy_of_compose(tmp_path)
    text = (folder / "compose.yaml").read_text()
    assert old in text
    (folder / "compose.yaml").write_text(text.replace(old, new, 1))
    done = compose("config", "--quiet", folder=folder)
    assert done.returncode != 0 and said in done.stderr, (done.returncode, done.stderr)


def test_config_output_names_the_secret_files_but_holds_none_of_their_values(tmp_path: Path) -> None:
    folder = copy_of_compose(tmp_path)
    values = {name: f"known-{name}-value-{os.urandom(6).hex()}" for name in SECRET_FILES}
    for name, value in values.items():
        (folder / "secrets" / name).write_text(value + "\n")
        (folder / "secrets" / name).chmod(0o400)
    done = compose("config", folder=folder, env={"KOALA_HOST": "koala.test.example"})
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    leaked = [name for name, value in values.items() if value in output]
    assert not leaked, f"docker-compose config printed the values of {leaked}"
    config = yaml.safe_load(done.stdout)
    assert {name: config["secrets"][name]["file"] for name in SECRET_FILES} == {
        name: str(folder / "secrets" / name) for name in SECRET_FILES
    }
    assert config["services"]["web"]["environment"]["ALLOWED_HOSTS"] == "koala.test.example"


def test_every_koala_service_reads_its_secrets_through_file_variables_only() -> None:
    config = shipped()
    for name in KOALA_SERVICES:
        service = config["services"][name]
        env = service["environment"]
        mounted = set(service["secrets"])
        files = {k: v for k, v in env.items() if k.endswith("_FILE")}
        assert files, name
        for variable, path in files.items():
            assert path.startswith("/run/secrets/") and path.removeprefix("/run/secrets/") in mounted, (name, variable)
        # No secret as a plain value: a variable named like one is only ever its *_FILE.
        plain = [k for k in env if re.search(r"SECRET|PASSWORD|API_KEY|TOKEN|DATABASE_URL", k) and not k.endswith("_FILE")]
        assert plain == [], f"{name}: {plain}"
    worker = config["services"]["worker"]
    assert {"payments_api_key", "models_api_key"} <= set(worker["secrets"])
    assert not {"payments_api_key", "models_api_key"} & set(config["services"]["web"]["secrets"]), "only workers call providers"
    assert config["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"


def test_every_service_is_bounded_read_only_and_started_after_what_it_needs() -> None:
    config = shipped()
    for name, service in config["services"].items():
        limits = service["deploy"]["resources"]["limits"]
        # (config accepts any memory value: "lots" too, so the form is checked here.)
        assert re.fullmatch(r"\d+[MG]", limits.get("memory", "")), f"{name}: a memory limit ({limits})"
        assert float(limits.get("cpus", 0)) > 0, f"{name}: a CPU limit"
        assert service.get("read_only") is True, f"{name}: read-only root file system"
        restart = service.get("restart")
        assert restart == ("no" if name == "migrate" else "on-failure:5"), f"{name}: a bounded restart ({restart})"
    for name in KOALA_SERVICES:
        service = config["services"][name]
        assert service["tmpfs"] == ["/tmp:size=64m,mode=1777"] and service["volumes"] == ["koala-data:/var/lib/koala"]
        assert service["init"] is True, "tini reaps the fork worker's work horses"
        waits = service["depends_on"]
        if name == "migrate":
            assert waits == {"postgres": {"condition": "service_healthy"}}
        else:
            assert waits == {
                "migrate": {"condition": "service_completed_successfully"},
                "redis": {"condition": "service_healthy"},
            }
    for name in ("postgres", "redis", "web"):
        assert config["services"][name]["healthcheck"]["test"][0] == "CMD", f"{name}: a healthcheck others wait on"
    assert "readyz.py" in " ".join(config["services"]["web"]["healthcheck"]["test"])
    assert config["services"]["worker"]["deploy"]["replicas"] == 2


# What `up` gives each container: Compose 1.29's own translation (compose/project.py), run by the
# interpreter Debian's docker-compose runs with.
TRANSLATE = """
import json, sys
from compose.config import config
from compose.config.environment import Environment
from compose.project import translate_deploy_keys_to_container_config
folder = sys.argv[1]
data = config.load(config.find(folder, ["compose.yaml"], Environment.from_env_file(folder)))
out = {}
for service in data.services:
    replicas = service.get("deploy", {}).get("replicas")
    translated, ignored = translate_deploy_keys_to_container_config(dict(service))
    out[service["name"]] = {
        "mem_limit": translated.get("mem_limit"), "cpus": translated.get("cpus"),
        "restart": translated.get("restart"), "ignored": ignored, "replicas": replicas,
    }
print(json.dumps(out))
"""


def test_compose_1_29_gives_each_container_its_limits_and_bounded_restart_without_swarm() -> None:
    tool = require_tool("docker-compose")
    interpreter = Path(tool).read_text().splitlines()[0].removeprefix("#!").split()
    done = subprocess.run(
        [*interpreter, "-c", TRANSLATE, str(COMPOSE_DIR)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    translated = json.loads(done.stdout)
    limits = {name: s["deploy"]["resources"]["limits"] for name, s in shipped()["services"].items()}
    for name, container in translated.items():
        assert container["ignored"] == [], f"{name}: Compose would ignore {container['ignored']}"
        assert (container["mem_limit"], container["cpus"]) == (limits[name]["memory"], float(limits[name]["cpus"]))
        expected = {"Name": "no", "MaximumRetryCount": 0} if name == "migrate" else {"Name": "on-failure", "MaximumRetryCount": 5}
        assert container["restart"] == expected, name
    assert translated["worker"]["replicas"] == 2


# -- the Dockerfile and .dockerignore -------------------------------------------------------------
def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions (continuations joined, comments dropped)."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def test_the_image_runs_as_the_unprivileged_koala_agent() -> None:
    users = [rest for keyword, rest in instructions() if keyword == "USER"]
    assert users == ["10001:10001"], users
    [created] = [rest for keyword, rest in instructions() if keyword == "RUN" and "useradd" in rest]
    assert "--uid 10001" in created and "koala-agent" in created and "--shell /usr/sbin/nologin" in created


def test_the_image_installs_only_hash_pinned_requirements() -> None:
    installs = [rest for keyword, rest in instructions() if keyword == "RUN" and "pip install" in rest]
    assert installs and all("--require-hashes" in rest and "requirements/base.txt" in rest for rest in installs), installs
    base = (REPO / "requirements" / "base.txt").read_text()
    assert "--hash=sha256:" in base and "pip-compile" in base


def test_the_image_checks_readyz_and_runs_one_role_per_container() -> None:
    found = dict(instructions())
    assert "readyz.py" in found["HEALTHCHECK"] and found["HEALTHCHECK"].split()[0].startswith("--interval")
    assert '"/readyz"' in (REPO / "deploy" / "docker" / "readyz.py").read_text()
    assert json.loads(found["ENTRYPOINT"]) == ["/opt/koala/deploy/docker/entrypoint"]
    assert json.loads(found["CMD"]) == ["web"]
    assert found["VOLUME"] == '["/var/lib/koala"]'
    assert found["FROM"].startswith("${PYTHON_IMAGE}")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.12-slim", DOCKERFILE.read_text(), re.M)


def test_no_layer_gets_a_secret_or_an_env_file() -> None:
    for keyword, rest in instructions():
        if keyword in {"COPY", "ADD"}:
            assert ".env" not in rest and "secret" not in rest.lower(), rest
        if keyword in {"ENV", "ARG"}:
            assert not re.search(r"SECRET|PASSWORD|API_KEY|TOKEN", rest), f"{keyword} {rest}"
    # The one build-time run of Koala uses placeholder URLs, no secret.
    [static] = [rest for keyword, rest in instructions() if keyword == "RUN" and "collectstatic" in rest]
    assert "SECRET_KEY" not in static


def test_the_build_context_leaves_out_secrets_and_local_state() -> None:
    ignored = {line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")}
    for pattern in (".env", ".env.*", "**/.env", ".koala-data", ".venv", ".git", "deploy/compose/secrets/*", "**/secrets"):
        assert pattern in ignored, f".dockerignore: {pattern}"
    assert not any(line.startswith("!") for line in ignored), "nothing re-included"
    # The real secret files are never committed either.
    gitignore = (COMPOSE_DIR / "secrets" / ".gitignore").read_text().split()
    assert gitignore[-3:] == ["*", "!.gitignore", "!*.example"]
    examples = {p.name.removesuffix(".example") for p in (COMPOSE_DIR / "secrets").glob("*.example")}
    assert examples == set(SECRET_FILES)


def test_the_entrypoint_refuses_an_unknown_role_naming_the_roles(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO / "deploy" / "docker" / "entrypoint"), "webb"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "KOALA_HOME": str(REPO)},
        check=False,
    )
    assert done.returncode == 64 and "one of: web, worker, beat, migrate, manage" in done.stderr, done.stderr


# -- make-secrets ---------------------------------------------------------------------------------
def test_make_secrets_writes_each_file_once_mode_0400_with_one_database_password(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    script = str(COMPOSE_DIR / "make-secrets")
    done = subprocess.run([script, str(folder)], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in folder.iterdir()) == sorted(SECRET_FILES)
    values = {name: (folder / name).read_text() for name in SECRET_FILES}
    assert all(stat.S_IMODE((folder / name).stat().st_mode) == 0o400 for name in SECRET_FILES)
    if os.geteuid() == 0:
        owners = {name: (folder / name).stat().st_uid for name in SECRET_FILES}
        assert owners == {**dict.fromkeys(SECRET_FILES, 10001), "postgres_password": 999}
    password = values["postgres_password"].strip()
    assert len(password) == 64 and re.fullmatch(r"[A-Za-z0-9_-]+", password)
    assert values["database_url"].strip() == f"postgres://koala:{password}@postgres:5432/koala"
    assert len(values["secret_key"].strip()) == 64 and values["secret_key"] != values["postgres_password"]
    token = values["metrics_token"]
    assert len(token.strip()) == 64 and token not in {values["secret_key"], values["postgres_password"]}
    assert values["payments_api_key"] == values["models_api_key"] == "\n", "no key until one is written in"
    for name, value in values.items():
        assert not value.strip() or value.strip() not in done.stdout + done.stderr, f"make-secrets printed {name}"
    # Run again: every file kept as it was.
    again = subprocess.run([script, str(folder)], capture_output=True, text=True, timeout=30, check=False)
    assert again.returncode == 0 and again.stdout.count("kept ") == len(SECRET_FILES), again.stdout
    assert {name: (folder / name).read_text() for name in SECRET_FILES} == values
    # One of the two that share the password gone: refused, not made up.
    (folder / "database_url").unlink()
    broken = subprocess.run([script, str(folder)], capture_output=True, text=True, timeout=30, check=False)
    assert broken.returncode == 1 and "share" in broken.stderr and not (folder / "database_url").exists()
