"""The shipped systemd units and env example, read as data: what every unit must say, that each
command is one this checkout can run, and that the settings they rely on parse strictly.

Whether each command really serves is tests/acceptance/test_deploy_units.py (it starts them);
``systemd-analyze verify`` and ``security`` run in tests/unit/test_deploy_hardening.py.
"""

from __future__ import annotations

import io
import os
import re
import runpy
from contextlib import redirect_stderr
from pathlib import Path
from typing import Any

import pytest
from django.core.management import get_commands
from django.test import override_settings

from devtools.servers import uvicorn_command
from koala.checks import check_export_root_outside_the_code
from tests.support.units import (
    ALL_UNITS,
    ENV_EXAMPLE,
    HOST_CODE,
    HOST_STATE,
    PROVIDER_CREDENTIALS,
    REPO,
    SERVICE_UNITS,
    SERVICE_USER,
    TICK_SERVICES,
    TICK_TASKS,
    TIMER_UNITS,
    UNITS_DIR,
    Unit,
    command_line,
    parse_unit,
    read_env_file,
    units,
)

VENV_PYTHON = f"{HOST_CODE}/.venv/bin/python"
LONG_RUNNING = tuple(name for name in SERVICE_UNITS if name != "koala-migrate.service" and name not in TICK_SERVICES)
# Every service unit says these, exactly.
SAME_IN_EVERY_SERVICE = {
    "User": SERVICE_USER,
    "Group": SERVICE_USER,
    "WorkingDirectory": HOST_CODE,
    "EnvironmentFile": "/etc/koala/koala.env",
    "StateDirectory": "koala",
    "StateDirectoryMode": "0750",
    "ReadWritePaths": HOST_STATE,
    "UMask": "0077",
}
# The sandbox every Koala unit (the alert included) says, exactly; how much it leaves exposed is
# scored by systemd-analyze security in tests/unit/test_deploy_hardening.py.
SANDBOX = {
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "RestrictSUIDSGID": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "RestrictRealtime": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallErrorNumber": "EPERM",
}
SECRET_KEY_CREDENTIAL = "secret_key:/etc/koala/credentials/secret_key"
# Only the workers run bodies that call the providers.
PROVIDER_SETTINGS = {"payments_api_key": "KOALA_PAYMENTS_API_KEY", "models_api_key": "KOALA_MODELS_API_KEY"}
SECRETS = {"SECRET_KEY", "KOALA_PAYMENTS_API_KEY", "KOALA_MODELS_API_KEY", "EMAIL_HOST_PASSWORD", "SENTRY_DSN"}


def seconds(value: str | None) -> float:
    """A systemd time span as the units write it (``75``, ``75s``, ``5min``)."""
    assert value, "a time span is set"
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, f"write {value!r} as seconds or minutes"
    return float(match[1]) * (60 if match[2] == "min" else 1)


def exec_start(unit: Unit) -> list[str]:
    [line] = unit.values("Service", "ExecStart")
    return command_line(line)


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_unit_file_is_known_and_parses() -> None:
    shipped = {p.name for p in [*UNITS_DIR.glob("*.service"), *UNITS_DIR.glob("*.timer")]}
    assert shipped == set(ALL_UNITS), "a new unit belongs in tests/support/units.py (then every check here covers it)"
    assert all(unit.sections.get("Timer" if name.endswith(".timer") else "Service") for name, unit in units().items())


@pytest.mark.parametrize("name", SERVICE_UNITS)
def test_every_service_runs_as_koala_confined_with_its_environment_and_secret(name: str) -> None:
    unit = units()[name]
    said = {key: unit.values("Service", key) for key in SAME_IN_EVERY_SERVICE}
    assert said == {key: [value] for key, value in SAME_IN_EVERY_SERVICE.items()}
    assert "SECRET_KEY_FILE=%d/secret_key" in unit.values("Service", "Environment")
    assert unit.value("Service", "Type") in {"exec", "oneshot"}, "exec: a start fails when the program cannot run"
    for key in ("MemoryMax", "CPUQuota", "TasksMax"):
        assert unit.value("Service", key), f"{key}: a bound, chosen from measurements (the comment says how)"
    assert unit.value("Unit", "OnFailure") == "koala-alert@%N.service"


@pytest.mark.parametrize("name", SERVICE_UNITS)
def test_every_service_loads_the_secret_key_and_only_the_workers_load_provider_keys(name: str) -> None:
    unit = units()[name]
    worker = name == "koala-worker@.service"
    # Only the web serves /metrics: only it loads the scrape's bearer token.
    web = name == "koala-web.service"
    expected = [SECRET_KEY_CREDENTIAL] + [f"{c}:/etc/koala/credentials/{c}" for c in PROVIDER_CREDENTIALS if worker]
    expected += ["metrics_token:/etc/koala/credentials/metrics_token"] if web else []
    assert unit.values("Service", "LoadCredential") == expected
    files = {e.partition("=")[0]: e.partition("=")[2] for e in unit.values("Service", "Environment") if "_FILE=" in e}
    assert files == {
        "SECRET_KEY_FILE": "%d/secret_key",
        **({f"{setting}_FILE": f"%d/{c}" for c, setting in PROVIDER_SETTINGS.items()} if worker else {}),
        **({"KOALA_METRICS_TOKEN_FILE": "%d/metrics_token"} if web else {}),
    }, "each credential is read by Koala through NAME_FILE, from the credentials folder (%d)"


@pytest.mark.parametrize("name", [*SERVICE_UNITS, "koala-alert@.service"])
def test_every_service_is_sandboxed_alike(name: str) -> None:
    unit = units()[name]
    said = {key: unit.values("Service", key) for key in SANDBOX}
    assert said == {key: [value] for key, value in SANDBOX.items()}
    assert unit.value("Service", "User") == SERVICE_USER, "never root"
    worker = name == "koala-worker@.service"
    # A worker's work horse lowers its own limits (setrlimit) for the per-attempt ceilings; every
    # other unit denies @resources with @privileged.
    assert unit.values("Service", "SystemCallFilter") == [
        "@system-service",
        "~@privileged @resources",
        *(["setrlimit prlimit64"] if worker else []),
    ]


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_every_server_restarts_boundedly_after_the_migrations_and_is_enabled(name: str) -> None:
    unit = units()[name]
    assert unit.value("Service", "Restart") == "on-failure"
    assert seconds(unit.value("Service", "RestartSec")) >= 1
    burst, interval = unit.value("Unit", "StartLimitBurst"), seconds(unit.value("Unit", "StartLimitIntervalSec"))
    assert burst and 2 <= int(burst) and interval > int(burst) * seconds(unit.value("Service", "RestartSec")), (
        "the start limit must be reachable by a crash loop (burst restarts fit in the interval)"
    )
    assert unit.value("Service", "CPUQuota"), "a CPU bound"
    assert unit.value("Service", "TimeoutStopSec")
    for key in ("After", "Wants"):
        assert "koala-migrate.service" in " ".join(unit.values("Unit", key)).split(), f"{key}=koala-migrate.service"
    assert unit.value("Install", "WantedBy") == "multi-user.target"


def test_the_units_name_only_units_that_are_shipped() -> None:
    for unit in units().values():
        for key in ("After", "Wants", "Requires", "OnFailure"):
            for named in " ".join(unit.values("Unit", key)).split():
                if named.startswith("koala-"):
                    template = re.sub(r"@[^.]+\.", "@.", named)
                    assert (UNITS_DIR / template).exists(), f"{unit.name}: {key}={named} is not in deploy/systemd"


@pytest.mark.parametrize("name", SERVICE_UNITS)
def test_every_command_is_the_venvs_python_running_something_this_checkout_has(name: str) -> None:
    """The old web unit ran /opt/koala/.venv/bin/gunicorn, which no requirement installs."""
    unit = units()[name]
    lines = unit.values("Service", "ExecStart")
    assert lines and (len(lines) == 1 or unit.value("Service", "Type") == "oneshot")
    pinned = {re.split(r"[<>=\[ ]", line)[0].lower() for line in (REPO / "requirements/base.in").read_text().splitlines()}
    for line in lines:
        argv = command_line(line)
        assert argv[0] == VENV_PYTHON, f"{name}: {argv[0]}"
        if argv[1] == "-m":
            assert argv[2] in pinned, f"{name}: python -m {argv[2]}: not a runtime requirement (requirements/base.in)"
        else:
            assert argv[1] == "manage.py" and argv[2] in get_commands(), f"{name}: {argv[1:3]}"


def test_the_web_runs_uvicorn_on_asgi_with_the_options_of_devtools_servers() -> None:
    unit = units()["koala-web.service"]
    argv = exec_start(unit)
    graceful = float(option(argv, "--timeout-graceful-shutdown"))
    expected = uvicorn_command(
        python=VENV_PYTHON,
        app_dir=HOST_CODE,
        host=option(argv, "--host"),
        port=int(option(argv, "--port")),
        workers=int(option(argv, "--workers")),
        forwarded_allow_ips=option(argv, "--forwarded-allow-ips"),
        graceful_seconds=graceful,
        access_log=False,
    )
    assert argv == expected
    assert "koala.asgi:application" in argv and option(argv, "--host") == "127.0.0.1", "loopback: the proxy is in front"
    assert seconds(unit.value("Service", "TimeoutStopSec")) > graceful, "systemd waits for the graceful shutdown"


def test_the_web_checks_its_settings_in_a_process_that_exits_before_uvicorn_starts() -> None:
    """uvicorn's supervisor restarts server processes that die of a bad setting for ever: the
    start limit and the alert would never see it (deploy/docker/entrypoint does the same)."""
    unit = units()["koala-web.service"]
    assert [command_line(line) for line in unit.values("Service", "ExecStartPre")] == [
        [VENV_PYTHON, "manage.py", "check", "--fail-level", "ERROR"]
    ]
    assert all(not units()[name].values("Service", "ExecStartPre") for name in SERVICE_UNITS if name != unit.name)


def test_the_worker_is_never_killed_before_its_shutdown_deadline_and_release() -> None:
    unit = units()["koala-worker@.service"]
    argv = exec_start(unit)
    env = read_env_file(ENV_EXAMPLE)
    assert "KOALA_SHUTDOWN_DEADLINE_SECONDS" not in env, "one deadline, in the unit, beside its TimeoutStopSec"
    deadline = float(option(argv, "--shutdown-deadline"))
    lease = float(env.get("KOALA_LEASE_SECONDS", 30))
    statement_timeout = float(env.get("KOALA_DB_STATEMENT_TIMEOUT_SECONDS", lease / 3))
    # After the deadline the worker releases the job: writes bounded by the statement timeout.
    assert seconds(unit.value("Service", "TimeoutStopSec")) > deadline + statement_timeout
    assert (unit.value("Service", "KillSignal"), unit.value("Service", "KillMode")) == ("SIGTERM", "control-group")
    assert "%i" in option(argv, "--name"), "each instance has its own fixed name"


def test_the_migrate_step_migrates_then_collects_static_files_and_is_never_cut_short() -> None:
    unit = units()["koala-migrate.service"]
    assert [command_line(line)[1:3] for line in unit.values("Service", "ExecStart")] == [
        ["manage.py", "migrate"],
        ["manage.py", "collectstatic"],
    ]
    assert all("--noinput" in command_line(line) for line in unit.values("Service", "ExecStart"))
    assert (unit.value("Service", "Type"), unit.value("Service", "RemainAfterExit")) == ("oneshot", "yes")
    assert unit.value("Service", "TimeoutStartSec") == "infinity"


def test_the_env_example_keeps_every_written_file_in_the_state_directory_and_no_secret() -> None:
    env = read_env_file(ENV_EXAMPLE)
    for name in ("KOALA_DATA_DIR", "KOALA_EXPORT_ROOT", "STATIC_ROOT"):
        assert name in env and (env[name] == HOST_STATE or env[name].startswith(HOST_STATE + "/")), (
            f"{name} must be under {HOST_STATE} (StateDirectory=koala: the one writable folder under ProtectSystem=strict)"
        )
    assert not SECRETS & set(env), "secrets are credentials (LoadCredential, NAME_FILE), never in the env file"
    assert not any(name.endswith("_FILE") for name in env), "a *_FILE path is a credential: %d only expands in a unit"
    assert env.get("DEBUG", "false") == "false"


def test_every_variable_of_the_env_example_is_documented() -> None:
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (REPO / "docs/configuration.md").read_text()))
    missing = set(read_env_file(ENV_EXAMPLE)) - documented
    assert not missing, f"document these in docs/configuration.md: {sorted(missing)}"


# -- the settings the env example relies on --------------------------------------------------------
def load_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    """koala/settings.py executed afresh with these variables (and the test's others)."""
    for name in ("DEBUG", "SECURE_COOKIES", "SECURE_COOKIES_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith(("KOALA_HSTS", "KOALA_SECURE", "KOALA_TRUST"))]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(REPO / "koala" / "settings.py"), run_name="koala_settings_probe")


def refused(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    stderr = io.StringIO()
    with redirect_stderr(stderr), pytest.raises(SystemExit) as stopped:
        load_settings(monkeypatch, **env)
    assert stopped.value.code == 2
    return stderr.getvalue()


def test_https_settings_are_off_by_default_for_make_run_and_the_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_settings(monkeypatch)
    assert (
        loaded["SECURE_SSL_REDIRECT"],
        loaded["SECURE_HSTS_SECONDS"],
        loaded["SECURE_HSTS_INCLUDE_SUBDOMAINS"],
        loaded["SECURE_HSTS_PRELOAD"],
        loaded["SECURE_PROXY_SSL_HEADER"],
        loaded["SESSION_COOKIE_SECURE"],
    ) == (False, 0, False, False, None, True)
    assert load_settings(monkeypatch, DEBUG="true")["SESSION_COOKIE_SECURE"] is False


def test_the_env_examples_https_settings_reach_django(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {k: v for k, v in read_env_file(ENV_EXAMPLE).items() if k.startswith(("KOALA_HSTS", "KOALA_SECURE"))}
    assert len(env) == 4, env
    loaded = load_settings(monkeypatch, **env, KOALA_TRUST_X_FORWARDED_PROTO="true")
    assert (
        loaded["SECURE_SSL_REDIRECT"],
        loaded["SECURE_HSTS_SECONDS"],
        loaded["SECURE_HSTS_INCLUDE_SUBDOMAINS"],
        loaded["SECURE_HSTS_PRELOAD"],
        loaded["SECURE_PROXY_SSL_HEADER"],
    ) == (True, 31_536_000, True, True, ("HTTP_X_FORWARDED_PROTO", "https"))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KOALA_HSTS_SECONDS": "1y"}, "KOALA_HSTS_SECONDS='1y' is not an integer"),
        ({"KOALA_HSTS_SECONDS": "-1"}, "KOALA_HSTS_SECONDS=-1 must be at least 0"),
        ({"KOALA_SECURE_SSL_REDIRECT": "sure"}, "KOALA_SECURE_SSL_REDIRECT='sure' is not a boolean"),
        ({"KOALA_TRUST_X_FORWARDED_PROTO": "https"}, "KOALA_TRUST_X_FORWARDED_PROTO='https' is not a boolean"),
        ({"KOALA_HSTS_INCLUDE_SUBDOMAINS": "true"}, "need KOALA_HSTS_SECONDS"),
        (
            {"KOALA_HSTS_SECONDS": "3600", "KOALA_HSTS_INCLUDE_SUBDOMAINS": "true", "KOALA_HSTS_PRELOAD": "true"},
            "KOALA_HSTS_PRELOAD needs",
        ),
        ({"KOALA_HSTS_SECONDS": "31536000", "KOALA_HSTS_PRELOAD": "true"}, "KOALA_HSTS_PRELOAD needs"),
    ],
)
def test_a_malformed_https_setting_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    said = refused(monkeypatch, **env)
    assert said.startswith("Koala configuration error: ") and message in said, said


def test_the_data_dir_holds_exports_and_static_files_unless_each_is_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    loaded = load_settings(monkeypatch, KOALA_DATA_DIR=str(tmp_path))
    assert (loaded["KOALA_EXPORT_ROOT"], loaded["STATIC_ROOT"]) == (tmp_path / "exports", tmp_path / "staticfiles")
    assert loaded["STORAGES"]["exports"]["OPTIONS"]["location"] == str(tmp_path / "exports")
    loaded = load_settings(monkeypatch, KOALA_DATA_DIR=str(tmp_path), STATIC_ROOT=str(tmp_path / "s"))
    assert loaded["STATIC_ROOT"] == tmp_path / "s"


def test_parse_unit_keeps_repeated_keys_and_joins_continuations(tmp_path: Path) -> None:
    path = tmp_path / "x.service"
    path.write_text("# c\n[Service]\n; c\nExecStart=/bin/a \\\n  --b\nExecStart=/bin/c\nEnvironment=A=1\nEnvironment=B=2\n")
    unit = parse_unit(path)
    assert unit.values("Service", "ExecStart") == ["/bin/a --b", "/bin/c"]
    assert unit.value("Service", "Environment") == "B=2" and unit.value("Unit", "After") is None


def test_check_deploy_warns_about_an_exports_folder_inside_the_code(settings: Any) -> None:
    """The old env example's exports went to /opt/koala/.koala-data, read-only under ProtectSystem=strict."""

    def with_location(location: str) -> list[str]:
        exports = {**settings.STORAGES["exports"], "OPTIONS": {"location": location}}
        with override_settings(STORAGES={**settings.STORAGES, "exports": exports}):
            return [w.id for w in check_export_root_outside_the_code()]

    assert with_location(str(REPO / ".koala-data" / "exports")) == ["koala.W001"]
    assert with_location(HOST_STATE + "/exports") == []


# -- timer-started housekeeping ----------------------------------------------------------------------


def test_every_tick_task_has_a_oneshot_service_and_a_timer_and_nothing_else_does() -> None:
    """Each koala_tick task Koala ships (the engine's and the installed apps') has its pair."""
    from workers import hooks

    assert set(TICK_TASKS) == set(hooks.tick_tasks()), "a new tick task gets koala-TASK.service and .timer"
    assert {p.name for p in UNITS_DIR.glob("*.timer")} == set(TIMER_UNITS)


@pytest.mark.parametrize("task", TICK_TASKS)
def test_each_tick_service_runs_its_task_once_and_a_skip_is_not_a_failure(task: str) -> None:
    from workers.services.ticks import EXIT_PREVIOUS_RUNNING

    unit = units()[f"koala-{task}.service"]
    assert unit.value("Service", "Type") == "oneshot", "a bounded task: active while it runs, then done"
    assert exec_start(unit) == [VENV_PYTHON, "manage.py", "koala_tick", task]
    assert unit.values("Service", "SuccessExitStatus") == [str(EXIT_PREVIOUS_RUNNING)], "skipped (exit 75) raises no alert"
    assert seconds(unit.value("Service", "TimeoutStartSec")) >= 60, "a stuck run is stopped, not one still working"
    assert unit.value("Service", "Restart") is None, "the timer starts it again; a failure alerts (OnFailure)"
    assert unit.value("Install", "WantedBy") is None, "started by its timer, not at boot"


@pytest.mark.parametrize("task", TICK_TASKS)
def test_each_timer_is_persistent_spread_and_zoned_on_purpose(task: str) -> None:
    timer = units()[f"koala-{task}.timer"]
    assert timer.value("Timer", "Unit") == f"koala-{task}.service"
    calendar = timer.value("Timer", "OnCalendar") or ""
    assert calendar.endswith(" UTC"), f"{calendar!r}: a zone written in the timer, never the host's local one"
    assert timer.value("Timer", "Persistent") == "true", "a run missed while the host was off runs once at start"
    assert seconds(timer.value("Timer", "RandomizedDelaySec")) > 0 and timer.value("Timer", "FixedRandomDelay") == "true"
    assert seconds(timer.value("Timer", "AccuracySec")) <= 60
    assert timer.value("Install", "WantedBy") == "timers.target"
    text = (UNITS_DIR / f"koala-{task}.timer").read_text()
    assert f"systemd-analyze calendar --iterations=5 '{calendar}'" in text, "the timer says how to preview it"
