"""The benchmark peers' drivers (bench/peers/), without their packages: Koala's venv has neither
celery nor procrastinate, so this checks what the drivers decide before any library is imported
(their arguments and environment) and how they judge a run (the verification), and that the
peers stay out of Koala's own environment. Running them for real is
tests/acceptance/test_bench_smoke.py's ``compare`` case, against .venv-peers."""

from __future__ import annotations

import importlib.util
import re

import pytest

from bench.peers import _protocol, celery_driver, pg_floor, procrastinate_driver
from tests.conftest import REPO

ENV = {"REDIS_URL": "redis://127.0.0.1:6379/8", "DATABASE_URL": "postgres://root@127.0.0.1/x_bench"}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def test_koalas_venv_has_neither_celery_nor_procrastinate() -> None:
    assert importlib.util.find_spec("celery") is None
    assert importlib.util.find_spec("procrastinate") is None
    for name in ("base", "dev"):
        pinned = (REPO / "requirements" / f"{name}.txt").read_text().lower()
        assert not re.search(r"^(celery|procrastinate|kombu)==", pinned, flags=re.M), name


def test_the_peers_requirements_are_hash_pinned() -> None:
    text = (REPO / "requirements" / "bench-peers.txt").read_text()
    pins = re.findall(r"^([a-z0-9_.-]+)==([^ \\\n]+)", text, flags=re.M | re.I)
    names = {name.lower() for name, _ in pins}
    assert {"celery", "kombu", "procrastinate", "psycopg", "redis"} <= names, names
    assert int(dict((n.lower(), v) for n, v in pins)["celery"].split(".")[0]) == 5
    assert int(dict((n.lower(), v) for n, v in pins)["procrastinate"].split(".")[0]) == 3
    # Every pinned requirement carries at least one hash (pip install --require-hashes refuses otherwise).
    entries = re.split(r"\n(?=[a-z0-9_.-]+==)", text.split("\n", 1)[1], flags=re.I)
    for entry in entries:
        if re.match(r"[a-z0-9_.-]+==", entry, flags=re.I):
            assert "--hash=sha256:" in entry, entry.splitlines()[0]


@pytest.mark.parametrize("name", ["_protocol", "celery_driver", "procrastinate_driver", "pg_floor"])
def test_each_driver_imports_only_the_standard_library_at_module_level(name: str) -> None:
    # Its libraries load inside its roles only (so this venv, without them, can import it); that it
    # never imports Koala is an import-linter contract (pyproject.toml, "The benchmark peers ...").
    source = (REPO / "bench" / "peers" / f"{name}.py").read_text()
    top_level = [line for line in source.splitlines() if re.match(r"(import|from) ", line)]
    allowed = (
        r"from __future__ import|import (argparse|json|os|signal|sys|time)$|from (collections\.abc|typing|bench\.peers) import"
    )
    assert top_level and all(re.match(allowed, line) for line in top_level), top_level


def test_a_driver_parses_its_roles(env: None) -> None:
    args = _protocol.parse(["enqueue", "--jobs", "5", "--key", "k", "--queue", "q"], description="d", needs=["REDIS_URL"])
    assert (args.role, args.jobs, args.key, args.queue, args.index) == ("enqueue", 5, "k", "q", 0)
    assert _protocol.parse(["worker", "--index", "1"], description="d", needs=["REDIS_URL"]).index == 1
    assert _protocol.parse(["reset"], description="d", needs=["REDIS_URL", "DATABASE_URL"]).role == "reset"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["enqueue"], "enqueue needs --jobs >= 1, got 0"),
        (["verify", "--jobs", "0"], "verify needs --jobs >= 1, got 0"),
        (["serve"], "invalid choice"),
        (["worker", "--index", "-1"], "--index must be >= 0"),
        (["worker", "--key", ""], "--key must not be empty"),
        (["worker", "--bogus"], "unknown arguments ['--bogus']"),
        (["enqueue", "--jobs", "many"], "invalid int value"),
    ],
)
def test_a_driver_refuses_bad_arguments_by_name(env: None, argv: list[str], message: str) -> None:
    with pytest.raises(_protocol.DriverArgumentError, match=re.escape(message)):
        _protocol.parse(argv, description="d", needs=["REDIS_URL"])


def test_a_driver_refuses_a_missing_environment_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", ENV["REDIS_URL"])
    with pytest.raises(_protocol.DriverArgumentError, match="DATABASE_URL not set"):
        _protocol.parse(["reset"], description="d", needs=["DATABASE_URL", "REDIS_URL"])
    # Through main: exit status 2 and the reason, before any library is imported or anything touched.
    assert procrastinate_driver.main(["reset"]) == 2
    assert "procrastinate_driver: DATABASE_URL not set" in capsys.readouterr().err
    monkeypatch.delenv("REDIS_URL")
    assert celery_driver.main(["verify", "--jobs", "3"]) == 2
    assert "celery_driver: REDIS_URL not set" in capsys.readouterr().err


def test_the_counter_must_equal_the_job_count() -> None:
    assert _protocol.counter_problems(5, 5) == []
    assert _protocol.counter_problems(4, 5) == ["redis counter 4 != 5"]
    assert _protocol.counter_problems(6, 5) == ["redis counter 6 != 5"]  # a job that ran twice fails too


def test_celery_verification_counts_leftover_and_unacknowledged_messages() -> None:
    assert celery_driver.celery_problems(counter=10, jobs=10, queued=0, unacked=0) == []
    assert celery_driver.celery_problems(counter=8, jobs=10, queued=1, unacked=1) == [
        "redis counter 8 != 10",
        "1 messages left in the queue",
        "1 messages delivered but never acknowledged",
    ]


def test_procrastinate_and_floor_verification_want_every_row_succeeded() -> None:
    assert procrastinate_driver.procrastinate_problems(counter=3, jobs=3, statuses={"succeeded": 3}) == []
    assert procrastinate_driver.procrastinate_problems(counter=3, jobs=3, statuses={"succeeded": 2, "doing": 1}) == [
        "procrastinate_jobs statuses {'doing': 1, 'succeeded': 2}, expected {'succeeded': 3}"
    ]
    assert pg_floor.floor_problems(counter=3, jobs=3, states={"succeeded": 3}) == []
    assert pg_floor.floor_problems(counter=2, jobs=3, states={}) == [
        "redis counter 2 != 3",
        "floor job states {}, expected {'succeeded': 3}",
    ]


def test_celerys_broker_url_names_a_unix_socket_the_way_kombu_reads_it() -> None:
    from bench.peers.celery_driver import broker_url

    assert broker_url("unix:///tmp/k/redis.sock?db=3") == "redis+socket:///tmp/k/redis.sock?virtual_host=3"
    assert broker_url("unix:///tmp/k/redis.sock") == "redis+socket:///tmp/k/redis.sock?virtual_host=0"
    assert broker_url("redis://127.0.0.1:6379/8") == "redis://127.0.0.1:6379/8"
