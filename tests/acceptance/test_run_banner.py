"""`make run`'s last words: a short banner (URL, logins and where they are kept, how to stop) after the start-up settles.

It used to print the login first and then about 65 lines in four seconds (RQ's lines per doorbell,
whole emails), so the password left a 50-line terminal at once. Real koala_run, its real web
server, worker and beat, against the test database; the logins come from the data folder.
"""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from devtools import logins
from tests.conftest import REPO, worker_env
from tests.support.fleet import free_port, wait_exit

# transaction=True: koala_run and its children must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Output:
    """koala_run's merged output, line by line, read by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        threading.Thread(target=lambda: [self.lines.put(line.rstrip("\n")) for line in stream], daemon=True).start()

    def until(self, predicate, timeout: float) -> list[str]:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if predicate(line):
                return list(self.seen)
        raise AssertionError("koala_run output so far:\n" + "\n".join(self.seen))

    def until_banner(self, timeout: float) -> list[str]:
        """Everything up to the banner's closing rule."""

        def closing_rule(line: str) -> bool:
            return line.startswith("===") and any(x.startswith("Koala is running") for x in self.seen)

        return self.until(closing_rule, timeout)

    def during(self, seconds: float) -> list[str]:
        start = len(self.seen)
        try:
            self.until(lambda line: False, seconds)
        except AssertionError:
            pass
        return self.seen[start:]


def start_run(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], Output, int]:
    port = free_port()
    env = worker_env(DEBUG="true", KOALA_DATA_DIR=str(data_dir), KOALA_EXPORT_ROOT=str(data_dir / "exports"))
    del env["KOALA_JOB_KIND_MODULES"]  # make run's kinds (the demo enqueues emails and an export)
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "manage.py"), "koala_run", "--no-sandbox", "--port", str(port), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, Output(proc), port


def banner_of(seen: list[str]) -> list[str]:
    start = max(i for i, line in enumerate(seen) if line.startswith("Koala is running: "))
    assert seen[start - 1].startswith("===") and seen[-1].startswith("==="), seen
    return seen[start - 1 :]


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert wait_exit(proc, timeout=60) == 0


def test_banner_comes_last_with_the_stored_logins(tmp_path: Path, redis_clean: None) -> None:
    data_dir = tmp_path / "data"
    stored = [
        logins.Login("admin", "pw-admin-1", ("superuser",)),
        logins.Login("alice", "pw-alice-2", ("requester", "member of acme")),
        logins.Login("bob", "pw-bob-3", ("reviewers",)),
    ]
    source = logins.write(stored, data_dir)
    proc, output, port = start_run(data_dir, "--no-demo")
    try:
        seen = output.until_banner(90)
        text = "\n".join(banner_of(seen))
        assert f"Koala is running: http://127.0.0.1:{port}/admin/" in text
        assert f"Logins (kept in {source}):" in text
        for login in stored:
            row = f"{login.username} .* {login.password} .* {', '.join(login.roles)}"
            assert re.search(row, text), text
        assert "Ctrl-C stops everything" in text and str(data_dir) in text
        # Last: after the web server's start-up lines; and nothing routine follows it at once.
        web_ready = max(i for i, line in enumerate(seen) if "Uvicorn running on" in line)
        assert web_ready < seen.index(banner_of(seen)[0])
        assert len(output.during(3)) <= 2, output.seen
    finally:
        stop(proc)


def test_with_the_demo_the_banner_stays_on_a_50_line_screen(tmp_path: Path, redis_clean: None) -> None:
    data_dir = tmp_path / "data"
    proc, output, port = start_run(data_dir)
    try:
        seen = output.until_banner(120)
        text = "\n".join(banner_of(seen))
        found, source = logins.read(data_dir)
        assert found and source is not None and f"(kept in {source})" in text, text
        for login in found:
            assert login.username in text and login.password in text, text
        # One server serves both: the admin and the worker API, with the key the banner shows.
        key, _ = logins.read_api_key(data_dir)
        assert key and f"http://127.0.0.1:{port}/api/v1/ with key {key}" in text, text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=10) as page:
            assert page.status == 200 and b"csrfmiddlewaretoken" in page.read()
        register = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/workers/register",
            data=json.dumps({"name": "banner-check", "kinds": ["http.echo@1"]}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(register, timeout=10) as answer:
            assert answer.status == 200 and json.loads(answer.read())["worker_id"] == "banner-check"
        # The demo jobs keep running after the banner; a person must still see it a while later.
        after = output.during(6)
        assert len(after) + len(banner_of(seen)) < 50, "\n".join(after)
        assert not any("Content-Transfer-Encoding" in line or "Listening on" in line for line in output.seen), output.seen
    finally:
        stop(proc)
