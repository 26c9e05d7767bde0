"""The example workers run as their READMEs say, against a live server.

sdk/python/README.md ("A worker") and examples/node-worker/README.md ("Run it") each show a session
beside ``make run`` in ``sh`` blocks (tests/support/doc_commands.py, ``example_session``): the first makes a
worker key and starts the worker, which runs until it is stopped; the next ones are typed in a
second terminal, in order: enqueue, then look (and in both, then start a run of the workflow
``http_hello`` whose steps the worker serves, then look at it once it has ended). ``make run`` is stood in for by the API server
(uvicorn serving koala.asgi on the test database: tests/support/api_server.py), whose URL replaces
the documents' ``http://127.0.0.1:8000``. Every block runs in bash from the checkout as written,
``scripts/manage`` included, with only the test database's ``DATABASE_URL``/``REDIS_URL`` (which
scripts/manage uses, as beside ``make run``) and a ``KOALA_DATA_DIR`` of the test's own added to
the environment. The jobs the second terminal enqueues must be served by that worker, with the
results the README describes, and the worker must stop cleanly on SIGTERM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from flows.models import Run, RunStep
from tests.conftest import REPO, database_url_for_subprocess, wait_for
from tests.support.api_server import ApiServer
from tests.support.doc_commands import Block, blocks, example_documents, example_session
from traces.models import Span
from workers.models import TERMINAL_STATES, Attempt, Job, JobState, Operation, OperationState

# transaction=True: the server, scripts/manage and the worker are other processes and must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOCUMENTED_URL = "http://127.0.0.1:8000"
SDK_README = REPO / "sdk" / "python" / "README.md"
PYTHON_WORKER = REPO / "examples" / "python-worker" / "worker.py"


def reader_env(data_dir: Path) -> dict[str, str]:
    """A reader's shell beside ``make run``: nothing of Koala's configured but where the data is."""
    unset = ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "KOALA_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    return env | {
        "DATABASE_URL": database_url_for_subprocess(),
        "REDIS_URL": settings.REDIS_URL,
        "KOALA_DATA_DIR": str(data_dir),
        # python3 a Python >= 3.11 (the project's own), node whatever the machine has.
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
    }


def script(block: Block, url: str) -> str:
    text = "\n".join(block.lines)
    assert DOCUMENTED_URL in text or "KOALA_URL" not in text, text
    return text.replace(DOCUMENTED_URL, url)


def typed(block: Block, env: dict[str, str], url: str) -> str:
    """A block typed in the second terminal: it must succeed; what it printed."""
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script(block, url)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (block.where, done.stdout, done.stderr)
    return done.stdout


@contextmanager
def worker_started(block: Block, env: dict[str, str], url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The first terminal: the block runs in bash until the worker it starts is stopped."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script(block, url)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM to the worker (bash's child, or bash itself when it exec'd the last command), as a
    supervisor or Ctrl-C sends it: the worker must exit 0, and bash with it."""
    children = psutil.Process(proc.pid).children()
    (children[0] if children else psutil.Process(proc.pid)).send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()


def served(ids: list[int], proc: subprocess.Popen[bytes], log: Path) -> list[Job]:
    def ended() -> bool:
        assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{log.read_text()}"
        return Job.objects.filter(pk__in=ids, state__in=TERMINAL_STATES).count() == len(ids)

    wait_for(ended, timeout=60, what=f"jobs {ids} to be served")
    return [Job.objects.get(pk=job_id) for job_id in ids]


def check_python_sdk_example(jobs: list[Job], data_dir: Path, listing: str, more: list[str]) -> None:
    assert len(more) == 2, "the session is: the worker, the jobs, their listing, a run started, its listing and journal"
    # The README shows the example in full.
    shown = [b for b in blocks(SDK_README) if b.language == "python"]
    assert ["\n".join(b.lines) + "\n" for b in shown] == [PYTHON_WORKER.read_text()]
    invoice, echo = jobs
    assert (invoice.kind, invoice.state, invoice.attempts) == ("http.invoice", JobState.SUCCEEDED, 1), invoice.error_message
    written = data_dir / "invoices" / "invoice-2231:write.json"
    assert json.loads(written.read_text()) == {"invoice": "2231", "amount_minor": 1200, "currency": "EUR"}
    assert invoice.result == {"sent": True, "file": str(written)}
    assert invoice.run_state == {"invoice_file": str(written)}
    [op] = Operation.objects.filter(job=invoice)
    assert (op.name, op.key, op.state) == ("write", "invoice-2231:write", OperationState.SUCCEEDED)
    assert op.external_id == written.name
    assert Span.objects.filter(job=invoice, name="invoice.write").count() == 1
    assert (echo.kind, echo.state, echo.result) == ("http.echo", JobState.SUCCEEDED, {"echo": {"hello": "python"}})
    assert [p.name for p in written.parent.iterdir()] == [written.name], "one invoice, no partial file left"
    [row] = [line for line in listing.splitlines() if "http.invoice" in line]
    assert "succeeded" in row and " 1/5 " in row, listing
    # Then a run of http_hello, whose two steps the same worker serves (its Workflow's bodies).
    started, shown = more
    run_id = int(re.search(r"^run (\d+) of http_hello@1 started", started, re.M).group(1))  # type: ignore[union-attr]
    run = Run.objects.get(pk=run_id)
    assert (run.state, run.run_state) == ("succeeded", {"greeted": "Ada", "shouted": True}), (run.state, run.error)
    steps = {row.name: row for row in RunStep.objects.filter(run=run)}
    assert {name: row.state for name, row in steps.items()} == {"greet": "succeeded", "shout": "succeeded"}
    assert steps["greet"].output == {"greeting": "Hello, Ada!"}
    assert steps["shout"].output == {"shout": "HELLO, ADA!", "greeted": "Ada"}
    assert steps["greet"].state_after == {"greeted": "Ada"}, "greet's delta merged before shout became due"
    workers = {a.worker_id for a in Attempt.objects.filter(job__run_id=run_id)}
    assert len(workers) == 1 and workers == {a.worker_id for a in Attempt.objects.filter(job=invoice)}
    # What the session printed: the listing's row, then the journal of that run (JSON after it).
    assert re.search(rf"^run {run_id}\s+succeeded\s+http_hello@1", shown, re.M), shown
    journal = json.loads(shown[shown.index("{") :])
    assert (journal["id"], journal["state"], journal["run_state"]) == (run_id, "succeeded", run.run_state)
    assert {s["name"]: s["output"] for s in journal["steps"]} == {name: row.output for name, row in steps.items()}


def check_node_example(jobs: list[Job], data_dir: Path, listing: str, more: list[str]) -> None:
    [echo] = jobs
    assert (echo.kind, echo.state, echo.attempts) == ("http.echo", JobState.SUCCEEDED, 1), echo.error_message
    assert echo.result == {"echo": {"hello": "node", "delay_ms": 500}}
    [row] = [line for line in listing.splitlines() if "http.echo" in line]
    assert "succeeded" in row, listing
    # Then a run of http_hello, whose two steps the Node worker serves.
    started, runs = more
    run_id = int(re.search(r"run (\d+)", started).group(1))  # type: ignore[union-attr]
    run = Run.objects.get(pk=run_id)
    assert run.state == "succeeded" and run.run_state == {"greeted": "Ada", "shouted": True}, (run.state, run.error)
    steps = {row.name: row for row in RunStep.objects.filter(run=run)}
    assert steps["greet"].output == {"greeting": "Hello, Ada!"}
    assert steps["shout"].output == {"shout": "HELLO, ADA!", "greeted": "Ada"}
    workers = {a.worker_id for a in Attempt.objects.filter(job__run_id=run_id)}
    assert len(workers) == 1 and workers == {a.worker_id for a in Attempt.objects.filter(job=echo)}
    assert f"run {run_id}" in runs and "succeeded" in runs, runs


def run_ended(more: list[str]) -> Callable[[], bool]:
    """The runs a session's later blocks started (``run N …``) have ended."""

    def ended() -> bool:
        ids = [int(m) for text in more for m in re.findall(r"^run (\d+) of", text, re.M)]
        return Run.objects.filter(pk__in=ids, state__in=("succeeded", "failed", "cancelled")).count() == len(ids)

    return ended


# Each example README, and what its session must have done.
CHECKS: dict[str, Callable[[list[Job], Path, str, list[str]], None]] = {
    "sdk/python/README.md": check_python_sdk_example,
    "examples/node-worker/README.md": check_node_example,
}


@pytest.mark.parametrize("readme", example_documents(), ids=lambda path: str(path.relative_to(REPO)))
def test_the_example_worker_serves_the_jobs_its_readme_enqueues(readme: Path, api_server: ApiServer, tmp_path: Path) -> None:
    check = CHECKS.get(str(readme.relative_to(REPO)))
    assert check is not None, f"{readme.relative_to(REPO)}: say here what its session must do"
    if check is check_node_example and shutil.which("node") is None:
        pytest.skip("node is not installed")
    worker, enqueue, look, *later = example_session(readme)
    env = reader_env(tmp_path / "data")
    log = tmp_path / "worker.log"
    with worker_started(worker, env, api_server.url, log) as proc:
        printed = typed(enqueue, env, api_server.url)
        ids = [int(line) for line in printed.split()]
        assert ids, printed
        jobs = served(ids, proc, log)
        listing = typed(look, env, api_server.url)
        more: list[str] = []
        for block in later:  # a run started, then its listing once it has ended
            if more:
                wait_for(run_ended(more), timeout=60, what="the session's runs to end")
            more.append(typed(block, env, api_server.url))
        check(jobs, tmp_path / "data", listing, more)
        stop(proc, log)
