"""The markers are enforced (tests/support/markers.py): a test that starts a process without
``slow``, or asks for a fixture that starts one, or reaches the services by their location
without ``services``, fails, and says why. Run on small test files in a pytest of their own
(the plugin alone: no Django, no services)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # each case runs a pytest subprocess

CASES = """
import multiprocessing
import subprocess

import pytest


def nothing():
    pass


@pytest.fixture
def processes():
    yield "a stand-in with the name of the fixture that starts workers"


def test_quiet():
    assert 1 + 1 == 2


def test_popen_unmarked():
    subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_popen_marked():
    subprocess.run(["true"], check=True)


def test_spawn_unmarked():
    # multiprocessing's spawn raises no audit event: the kernel's count of reaped children sees it
    child = multiprocessing.get_context("spawn").Process(target=nothing)
    child.start()
    child.join()


def test_fixture_unmarked(processes):
    pass


@pytest.mark.slow
def test_fixture_marked(processes):
    pass
"""


def run_pytest(tmp_path: Path, source: str) -> dict[str, str]:
    """Each test's verdict: "passed", or "error: <message>" (setup or teardown), or "failed: <message>"."""
    (tmp_path / "test_cases.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.markers", "-p", "no:django", "-p", "no:xdist",
         "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning", "--junitxml=report.xml",
         "test_cases.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (tmp_path / "report.xml").exists(), done.stdout + done.stderr
    verdicts = {}
    for case in ElementTree.parse(tmp_path / "report.xml").iter("testcase"):
        problems = [f"{child.tag}: {child.get('message')}" for child in case if child.tag in ("error", "failure")]
        verdicts[case.get("name", "")] = "; ".join(problems) or "passed"
    return verdicts


def test_a_test_that_starts_a_process_must_be_slow(tmp_path: Path) -> None:
    verdicts = run_pytest(tmp_path, CASES)
    assert verdicts == {
        "test_quiet": "passed",
        "test_popen_unmarked": 'error: failed on teardown with "Failed: it started a process but is not marked '
        "slow (docs/testing.md, Markers): subprocess.Popen ['true']\"",
        "test_popen_marked": "passed",
        "test_spawn_unmarked": 'error: failed on teardown with "Failed: it started a process but is not marked '
        'slow (docs/testing.md, Markers): a child process, reaped during the test"',
        "test_fixture_unmarked": 'error: failed on setup with "Failed: its markers do not say what it does '
        '(docs/testing.md, Markers): it uses processes, which start a process, so it is slow"',
        "test_fixture_marked": "passed",
    }


def test_a_module_that_reaches_the_services_by_their_location_must_be_services(tmp_path: Path) -> None:
    source = (
        "import pytest\n"
        "from tests.dburl import database_url  # noqa: F401\n"
        "def test_unmarked():\n    pass\n"
        "@pytest.mark.services\ndef test_marked():\n    pass\n"
    )
    verdicts = run_pytest(tmp_path, source)
    assert verdicts == {
        "test_unmarked": 'error: failed on setup with "Failed: its markers do not say what it does '
        '(docs/testing.md, Markers): its module reaches PostgreSQL/Redis by their location (tests.dburl), so it is services"',
        "test_marked": "passed",
    }
