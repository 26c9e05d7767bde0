from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from koala import env
from koala.env import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_file_variant_reads_secret_and_strips_newline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "key"
    secret.write_text("from-a-file\n")
    monkeypatch.delenv("KOALA_T", raising=False)
    monkeypatch.setenv("KOALA_T_FILE", str(secret))
    assert env.string("KOALA_T") == "from-a-file"


def test_both_direct_and_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOALA_T", "a")
    monkeypatch.setenv("KOALA_T_FILE", str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="KOALA_T and KOALA_T_FILE"):
        env.string("KOALA_T")


def test_unreadable_file_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KOALA_T", raising=False)
    monkeypatch.setenv("KOALA_T_FILE", "/nonexistent/secret")
    with pytest.raises(ConfigError, match="KOALA_T_FILE"):
        env.string("KOALA_T")


@pytest.mark.parametrize(
    ("parse", "value", "message"),
    [
        (lambda: env.integer("KOALA_T", 1), "ten", "is not an integer"),
        (lambda: env.integer("KOALA_T", 1, minimum=1), "0", "at least 1"),
        (lambda: env.number("KOALA_T", 1.0), "1,5", "is not a number"),
        (lambda: env.boolean("KOALA_T"), "maybe", "is not a boolean"),
    ],
)
def test_malformed_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, parse, value: str, message: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KOALA_T", value)
    monkeypatch.delenv("KOALA_T_FILE", raising=False)
    with pytest.raises(ConfigError, match=f"KOALA_T.*{message}"):
        parse()


def _manage(*args: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("KOALA_", "DEBUG", "SECRET_KEY"))}
    environment.update(overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow  # a manage.py subprocess
def test_bad_setting_stops_startup_with_a_message_naming_it() -> None:
    result = _manage("check", KOALA_LEASE_SECONDS="thirty", SECRET_KEY="k" * 60)
    assert result.returncode == 2
    assert "KOALA_LEASE_SECONDS='thirty' is not a number" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # a manage.py subprocess
def test_heartbeat_must_be_shorter_than_lease() -> None:
    result = _manage("check", KOALA_LEASE_SECONDS="5", KOALA_HEARTBEAT_SECONDS="10", SECRET_KEY="k" * 60)
    assert result.returncode == 2 and "KOALA_HEARTBEAT_SECONDS" in result.stderr


@pytest.mark.slow  # a manage.py subprocess
def test_invalid_redaction_pattern_stops_startup() -> None:
    result = _manage("check", KOALA_REDACT_EXTRA_PATTERNS="acct-[0-9", SECRET_KEY="k" * 60)
    assert result.returncode == 2 and "KOALA_REDACT_EXTRA_PATTERNS has an invalid regex" in result.stderr


@pytest.mark.slow  # a manage.py subprocess
def test_missing_database_url_is_explained() -> None:
    environment_without_db = {"DATABASE_URL": "", "SECRET_KEY": "k" * 60}
    result = _manage("check", **environment_without_db)
    assert result.returncode == 2 and "DATABASE_URL is not set" in result.stderr


@pytest.mark.slow  # a manage.py subprocess
def test_non_postgres_database_is_refused() -> None:
    result = _manage("check", DATABASE_URL="sqlite:///tmp/x.db", SECRET_KEY="k" * 60)
    assert result.returncode == 2 and "must be a postgres:// URL" in result.stderr


@pytest.mark.slow  # a manage.py subprocess
def test_weak_secret_key_fails_the_system_check_outside_debug() -> None:
    result = _manage("check")
    assert result.returncode != 0 and "koala.E001" in result.stderr
    assert _manage("check", DEBUG="true").returncode == 0
    assert _manage("check", SECRET_KEY="k1-" + "abcdefghij" * 5).returncode == 0


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_non_finite_numbers_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("KOALA_T", value)
    monkeypatch.delenv("KOALA_T_FILE", raising=False)
    with pytest.raises(ConfigError, match=f"KOALA_T={value!r} is not a finite number"):
        env.number("KOALA_T", 1.0, minimum=0.0)


def test_a_config_error_is_improperly_configured() -> None:
    from django.core.exceptions import ImproperlyConfigured

    assert issubclass(ConfigError, ImproperlyConfigured)


def test_a_choice_is_one_of_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KOALA_T_FILE", raising=False)
    monkeypatch.setenv("KOALA_T", " Transaction ")
    assert env.choice("KOALA_T", "direct", ["direct", "transaction"]) == "transaction"
    monkeypatch.setenv("KOALA_T", "")
    assert env.choice("KOALA_T", "direct", ["direct", "transaction"]) == "direct"
    monkeypatch.setenv("KOALA_T", "statement")
    with pytest.raises(ConfigError, match="KOALA_T='statement' is not one of direct, transaction"):
        env.choice("KOALA_T", "direct", ["direct", "transaction"])


@pytest.mark.slow  # manage.py subprocesses
def test_database_pooling_settings_stop_startup_when_they_cannot_work() -> None:
    key = {"SECRET_KEY": "k1-" + "abcdefghij" * 5}
    bad = _manage("check", KOALA_DATABASE_POOLING="statement", **key)
    assert bad.returncode == 2 and "KOALA_DATABASE_POOLING='statement' is not one of direct, session, transaction" in bad.stderr
    prepared = _manage("check", KOALA_DATABASE_POOLING="transaction", KOALA_PREPARED_STATEMENTS="true", **key)
    assert prepared.returncode == 2
    assert "KOALA_PREPARED_STATEMENTS=true cannot work with KOALA_DATABASE_POOLING=transaction" in prepared.stderr
    url = os.environ["DATABASE_URL"]
    options = _manage(
        "check",
        KOALA_DATABASE_POOLING="transaction",
        DATABASE_URL=url + ("&" if "?" in url else "?") + "options=-c%20jit%3Doff",
        **key,
    )
    assert options.returncode == 2 and "DATABASE_URL sets startup options" in options.stderr
    assert "Traceback" not in prepared.stderr + options.stderr + bad.stderr
    # Unset, KOALA_PREPARED_STATEMENTS follows the mode; an explicit false is accepted in it.
    assert _manage("check", KOALA_DATABASE_POOLING="transaction", **key).returncode == 0
    assert _manage("check", KOALA_DATABASE_POOLING="transaction", KOALA_PREPARED_STATEMENTS="false", **key).returncode == 0
