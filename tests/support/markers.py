"""The ``slow`` and ``services`` markers, enforced rather than hoped for: a pytest plugin
(``pytest_plugins`` in tests/conftest.py) that needs nothing but pytest.

``slow``: every test that starts a process (a subprocess, a worker, a live server, a browser).
- At collection: every acceptance and browser test, and every test that asks for a fixture that
  starts one (``SLOW_FIXTURES``), carries it, or the run stops before any test runs.
- While it runs: a test that starts a process without the mark fails at teardown, naming what it
  started. Two witnesses, because neither sees everything: Python's audit events
  (``subprocess.Popen``, ``os.fork``, ``os.posix_spawn``, ``os.system``, ...) over the test's setup,
  call and teardown, and the kernel's count of reaped children (``RUSAGE_CHILDREN``) over its
  setup and call, which also sees what raises no audit event (multiprocessing's spawn). The
  teardown is left out of the second one: a session fixture's process (the browser) is reaped
  in whichever test happens to run last.

``services``: a test that depends on where PostgreSQL and Redis come from (the machine's
services over TCP, or the embedded ones on unix sockets), run by CI's services-mode pass
(.ci/run). A test module that builds its own way to them from the test database's settings
(``tests.dburl``, ``connection.settings_dict``, a TCP proxy in front of them) must mark every
test ``services``, or its tests error at setup. Handing the URLs to a subprocess the way
``worker_env()`` does (``database_url_for_subprocess``, ``demo_env``) is the same for every
worker test and is not such a dependency. A module can carry the mark for a reason no text
shows (the benchmarks open their own connections; PostgreSQL's planner differs between the
embedded and the machine's version); the rule only says which must.
"""

from __future__ import annotations

import re
import resource
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent
SLOW_TIERS = ("acceptance", "browser")
# Fixtures that start a process (or a live server) for the test that asks for them.
SLOW_FIXTURES = frozenset({"processes", "stray_pids", "private_redis", "api_server", "live_server", "browser"})
SERVICES_TEXT = re.compile(r"tests\.dburl|tests\.fakes\.netproxy|FaultProxy|connection\.settings_dict")
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "pty.spawn"})


# -- at collection ----------------------------------------------------------------------------
def tier(item: pytest.Item) -> str:
    try:
        return Path(str(item.path)).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return ""


@cache
def _service_location_named(path: Path) -> str:
    """The first text in the module that reaches the services by their location, or ""."""
    found = SERVICES_TEXT.search(path.read_text())
    return found.group(0) if found else ""


def mark_problems(items: list[pytest.Item]) -> list[tuple[pytest.Item, str]]:
    """The tests whose marks fail to say what they do, each with what is missing."""
    problems = []
    for item in items:
        missing = []
        if item.get_closest_marker("slow") is None:
            if tier(item) in SLOW_TIERS:
                missing.append(f"every {tier(item)} test is slow (it starts processes)")
            elif needs := sorted(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
                missing.append(f"it uses {', '.join(needs)}, which start a process, so it is slow")
        # The unit tier uses no services at all.
        if tier(item) != "unit" and item.get_closest_marker("services") is None:
            if named := _service_location_named(Path(str(item.path))):
                missing.append(f"its module reaches PostgreSQL/Redis by their location ({named}), so it is services")
        if missing:
            problems.append((item, "; ".join(missing)))
    return problems


# -- while a test runs ------------------------------------------------------------------------
class ProcessWatch:
    """Counts process starts in this interpreter (audit events) and reaped children (the kernel)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def install(self) -> None:
        sys.addaudithook(self._audit)  # for good: audit hooks cannot be removed

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event in PROCESS_EVENTS:
            what = args[1] if event == "subprocess.Popen" and len(args) > 1 else args[:1]
            self.started.append(f"{event} {str(what)[:200]}")

    @staticmethod
    def reaped() -> int:
        """Minor page faults of every child reaped so far: each new process makes thousands."""
        return resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt


WATCH = ProcessWatch()


# -- the hooks (tests/conftest.py loads this module as a plugin) ------------------------------
_DISHONEST = pytest.StashKey[str]()
_WATCHED = pytest.StashKey[tuple[int, int]]()
_REAPED_BY_CALL = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    WATCH.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each such test errors at setup, before any fixture runs (a UsageError here would only
    # crash the xdist workers that collected it, with the message lost).
    for item, problem in mark_problems(items):
        item.stash[_DISHONEST] = problem


@pytest.hookimpl(tryfirst=True)  # before pytest's own, which sets the fixtures up
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _DISHONEST in item.stash:
        pytest.fail(f"its markers do not say what it does (docs/testing.md, Markers): {item.stash[_DISHONEST]}", pytrace=False)
    item.stash[_WATCHED] = (len(WATCH.started), WATCH.reaped())


@pytest.hookimpl(wrapper=True, tryfirst=True, specname="pytest_runtest_setup")
def _after_setup(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        item.stash[_REAPED_BY_CALL] = WATCH.reaped()  # the call's wrapper moves it on


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    try:
        return (yield)
    finally:
        item.stash[_REAPED_BY_CALL] = WATCH.reaped()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    result = yield
    if item.get_closest_marker("slow") is None and _WATCHED in item.stash:
        events, reaped = item.stash[_WATCHED]
        started = WATCH.started[events:]
        if started or item.stash[_REAPED_BY_CALL] > reaped:
            what = "; ".join(started) or "a child process, reaped during the test"
            pytest.fail(f"it started a process but is not marked slow (docs/testing.md, Markers): {what}", pytrace=False)
    return result
