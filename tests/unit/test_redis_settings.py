"""Redis by URL or by Sentinel (koala/settings.py, koala/redis_client.py): strict parsing, and
the clients every part of Koala makes from it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest
from redis.sentinel import SentinelConnectionPool

from koala import redis_client
from tests.unit.test_deploy_units import REPO, load_settings, refused

SENTINEL_VARS = (
    "KOALA_REDIS_SENTINELS",
    "KOALA_REDIS_SENTINEL_MASTER",
    "KOALA_REDIS_SENTINEL_PASSWORD",
    "KOALA_REDIS_PASSWORD",
    "KOALA_REDIS_DB",
)


@pytest.fixture
def no_sentinels(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in SENTINEL_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(f"{name}_FILE", raising=False)
    return monkeypatch


def sentinel_mode(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:  # type: ignore[type-arg]
    monkeypatch.delenv("REDIS_URL", raising=False)
    return load_settings(monkeypatch, KOALA_REDIS_SENTINEL_MASTER="koala", **env)


def test_sentinels_configure_redis_and_django_rq_alike(no_sentinels: pytest.MonkeyPatch) -> None:
    loaded = sentinel_mode(
        no_sentinels, KOALA_REDIS_SENTINELS=" 10.0.0.1:26379, sentinel-b:26380,[::1]:26381 ", KOALA_REDIS_DB="3"
    )
    assert loaded["KOALA_REDIS_SENTINELS"] == [("10.0.0.1", 26379), ("sentinel-b", 26380), ("::1", 26381)]
    assert (loaded["REDIS_URL"], loaded["KOALA_REDIS_DB"], loaded["KOALA_REDIS_SOCKET_TIMEOUT_SECONDS"]) == ("", 3, 3.0)
    for config in loaded["RQ_QUEUES"].values():
        assert "URL" not in config
        assert (config["SENTINELS"], config["MASTER_NAME"], config["DB"]) == (loaded["KOALA_REDIS_SENTINELS"], "koala", 3)
        assert config["SENTINEL_KWARGS"]["socket_timeout"] == 1 and config["SOCKET_TIMEOUT"] == 3.0


def test_a_url_configures_redis_as_before(no_sentinels: pytest.MonkeyPatch) -> None:
    loaded = load_settings(no_sentinels, REDIS_URL="redis://cache:6379/2")
    assert loaded["KOALA_REDIS_SENTINELS"] == []
    assert {config["URL"] for config in loaded["RQ_QUEUES"].values()} == {"redis://cache:6379/2"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KOALA_REDIS_SENTINELS": "10.0.0.1"}, "KOALA_REDIS_SENTINELS: item 1 ('10.0.0.1') is not host:port"),
        ({"KOALA_REDIS_SENTINELS": "a:26379,b:0"}, "KOALA_REDIS_SENTINELS: item 2 ('b:0') is not host:port"),
        ({"KOALA_REDIS_SENTINELS": "a:26379,b:port"}, "item 2 ('b:port') is not host:port"),
        ({"KOALA_REDIS_SENTINELS": ":26379"}, "item 1 (':26379') is not host:port"),
        ({"KOALA_REDIS_SENTINELS": "redis://a:26379"}, "item 1 ('redis://a:26379') is not host:port"),
        ({"KOALA_REDIS_SENTINELS": "a:26379,a:26379"}, "item 2 ('a:26379') is listed twice"),
        ({"KOALA_REDIS_SENTINELS": "a:26379", "KOALA_REDIS_DB": "16"}, "KOALA_REDIS_DB=16 must be at most 15"),
        ({"KOALA_REDIS_SENTINELS": "a:26379", "KOALA_REDIS_DB": "x"}, "KOALA_REDIS_DB='x' is not an integer"),
    ],
)
def test_a_bad_sentinel_setting_stops_start_up_naming_it(
    no_sentinels: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    no_sentinels.delenv("REDIS_URL", raising=False)
    said = refused(no_sentinels, KOALA_REDIS_SENTINEL_MASTER="koala", **env)
    assert said.startswith("Koala configuration error: ") and message in said, said


def test_both_a_url_and_sentinels_are_refused(no_sentinels: pytest.MonkeyPatch) -> None:
    said = refused(
        no_sentinels, REDIS_URL="redis://cache:6379/0", KOALA_REDIS_SENTINELS="a:26379", KOALA_REDIS_SENTINEL_MASTER="m"
    )
    assert "REDIS_URL and KOALA_REDIS_SENTINELS are both set; set only one" in said, said


def test_sentinels_need_a_master_name(no_sentinels: pytest.MonkeyPatch) -> None:
    no_sentinels.delenv("REDIS_URL", raising=False)
    said = refused(no_sentinels, KOALA_REDIS_SENTINELS="a:26379")
    assert "KOALA_REDIS_SENTINELS is set but KOALA_REDIS_SENTINEL_MASTER" in said, said


@pytest.mark.parametrize("name", ["KOALA_REDIS_SENTINEL_MASTER", "KOALA_REDIS_PASSWORD", "KOALA_REDIS_DB"])
def test_sentinel_only_settings_beside_a_url_are_refused(no_sentinels: pytest.MonkeyPatch, name: str) -> None:
    said = refused(no_sentinels, REDIS_URL="redis://cache:6379/0", **{name: "1"})
    assert f"{name} is set but KOALA_REDIS_SENTINELS is not" in said, said


def test_neither_is_explained(no_sentinels: pytest.MonkeyPatch) -> None:
    no_sentinels.delenv("REDIS_URL", raising=False)
    no_sentinels.delenv("REDIS_URL_FILE", raising=False)
    said = refused(no_sentinels)
    assert "REDIS_URL is not set" in said and "KOALA_REDIS_SENTINELS" in said, said


def test_the_factory_gives_a_sentinel_discovered_master_with_timeouts(settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_REDIS_SENTINELS = [("127.0.0.1", 26379), ("127.0.0.1", 26380)]
    settings.KOALA_REDIS_SENTINEL_MASTER = "koala"
    settings.KOALA_REDIS_DB = 4
    settings.KOALA_REDIS_PASSWORD = "master-password"
    settings.KOALA_REDIS_SENTINEL_PASSWORD = "sentinel-password"
    client = redis_client.connect()  # connects lazily: nothing listens on these ports
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "koala"
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (
        4,
        "master-password",
        3.0,
        5.0,
    )
    asked = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in asked] == [26379, 26380]
    sentinel_kwargs = asked[0].connection_pool.connection_kwargs
    assert (sentinel_kwargs["socket_timeout"], sentinel_kwargs["password"]) == (1.0, "sentinel-password")
    assert redis_client.describe() == "Sentinel master 'koala' via 127.0.0.1:26379,127.0.0.1:26380"


def test_the_factory_gives_the_url_server_with_timeouts(settings) -> None:  # type: ignore[no-untyped-def]
    settings.KOALA_REDIS_SENTINELS = []
    settings.REDIS_URL = "redis://127.0.0.1:6399/5"
    kwargs = redis_client.connect().connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["db"], kwargs["socket_timeout"]) == (6399, 5, 3.0)


@pytest.mark.slow  # a manage.py subprocess
def test_a_worker_that_cannot_reach_the_sentinels_says_so_at_start() -> None:
    environment = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "REDIS_URL_FILE")}
    environment |= {
        "KOALA_REDIS_SENTINELS": "127.0.0.1:9",
        "KOALA_REDIS_SENTINEL_MASTER": "koala",
        "SECRET_KEY": secrets.token_urlsafe(50),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "koala_worker", "--burst"],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cannot reach Redis at Sentinel master 'koala' via 127.0.0.1:9: MasterNotFoundError" in result.stderr, result.stderr
