"""docs/worker-api.md's "Try it with curl" session runs as a person types it, against the live API
server: each command in order in one bash session (its variables carry over), with ``KOALA_URL``
and ``manage.py`` (the checkout's, on the server's database) from the environment. Every command
exits 0, every answer has the shape the document shows under it, and the job did succeed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import database_url_for_subprocess
from tests.support.api_server import ApiServer
from tests.support.demo import demo_env
from tests.support.doc_commands import MARKER, REPO, Block, Step, blocks, steps
from workers.models import Job

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # a live server and manage.py subprocesses

DOC = REPO / "docs" / "worker-api.md"
SECTION = "## Try it with curl"
END = "@@koala-doc-step"


def session() -> Block:
    """The marked block of the section (the demo runner skips it, naming this test)."""
    start = DOC.read_text().splitlines().index(SECTION) + 1
    [block] = [b for b in blocks(DOC) if b.line > start and b.skip_reason and Path(__file__).name in b.skip_reason]
    assert block.lines[0].startswith(MARKER)
    return block


def shown(step: Step) -> tuple[Any, int | None] | None:
    """What the document shows a command answering: a JSON value and, under it, an HTTP status."""
    lines = [line for line in step.output if not line.startswith("#")]
    if not lines:
        return None
    status = int(lines.pop()) if re.fullmatch(r"\d{3}", lines[-1]) else None
    return json.loads("\n".join(lines)), status


def same_shape(documented: Any, actual: Any, where: str = "$") -> list[str]:
    """Where the answer's shape differs from the document's: object keys, and each value's JSON type."""
    if isinstance(documented, dict):
        if not isinstance(actual, dict):
            return [f"{where}: an object in the document, {actual!r} here"]
        problems = (
            [f"{where}: keys {sorted(documented)} in the document, {sorted(actual)} here"]
            if set(documented) != set(actual)
            else []
        )
        return problems + [
            p for key in set(documented) & set(actual) for p in same_shape(documented[key], actual[key], f"{where}.{key}")
        ]
    kinds = (bool, int | float, str, list, type(None))
    expected = next(k for k in kinds if isinstance(documented, k))
    return (
        []
        if isinstance(actual, expected) and not (expected is not bool and isinstance(actual, bool))
        else [f"{where}: {documented!r} in the document, {actual!r} here"]
    )


def test_the_curl_session_runs_as_written_and_answers_what_the_document_shows(api_server: ApiServer, tmp_path: Path) -> None:
    missing = [tool for tool in ("curl", "jq") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the session needs {' and '.join(missing)} (install them: apt-get install curl jq)")
    commands = steps(session())
    assert len(commands) >= 10, [c.command for c in commands]  # keys, register, enqueue, acquire, heartbeat, complete twice
    script = "".join(f"{step.command}\nprintf '\\n{END} {i} %d\\n' $?\n" for i, step in enumerate(commands))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "manage.py"  # manage.py as a reader runs it from the checkout, on the server's database
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "manage.py"}" "$@"\n')
    shim.chmod(0o755)
    env = demo_env(tmp_path / "data") | {
        "DATABASE_URL": database_url_for_subprocess(),
        "KOALA_URL": api_server.url,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
    }
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    answers: dict[int, tuple[int, str]] = {}
    for output, index, status in re.findall(rf"(.*?)\n?{END} (\d+) (\d+)\n", done.stdout, re.S):
        answers[int(index)] = (int(status), output)
    assert len(answers) == len(commands), (done.stdout[-3000:], done.stderr[-3000:])

    problems: list[str] = []
    for index, step in enumerate(commands):
        status, output = answers[index]
        if status != 0:
            problems.append(f"$ {step.command}\n  exit {status}\n{output[-1000:]}")
            continue
        expected = shown(step)
        if expected is None:
            continue
        lines = output.strip().splitlines()
        actual_status = int(lines.pop()) if expected[1] is not None else None
        try:
            actual = json.loads("\n".join(lines))
        except ValueError:
            problems.append(f"$ {step.command}\n  answered {output[-1000:]!r}, not JSON")
            continue
        if actual_status != expected[1]:
            problems.append(f"$ {step.command}\n  HTTP {actual_status}, the document shows {expected[1]}")
        problems += [f"$ {step.command}\n  {p}" for p in same_shape(expected[0], actual)]
    assert not problems, "\n\n".join(problems) + "\n\n" + done.stderr[-2000:]

    # What the session did: the worker's job ran to success with the output it completed with.
    [job] = Job.objects.filter(kind="http.echo")
    assert (job.state, job.result) == ("succeeded", {"sent": True})
    lease = json.loads((tmp_path / "lease.json").read_text())["leases"][0]
    assert lease["job_id"] == job.pk
