"""Every shell command in README.md and docs/*.md runs as written against ``make run``'s demo.

The demo is made as ``make run`` makes it: ``koala_demo`` with make run's settings (DEBUG, the
default kinds, the sandbox provider's URL and port: the loopback provider here), then a worker
drains what is due (``koala_worker --burst``, make run's worker serving every queue). Then each
runnable block (tests/support/doc_commands.py says which, and how a transcript is read) runs in
bash, in document order (README.md, then docs/*.md by name), from the checkout, with
``manage.py`` and ``./manage.py`` being the project's manage.py on the test database: a script
block stops at its first failing command; a transcript checks each command's exit status and
error message. ``make manage ARGS="…"`` runs ``manage.py …`` here (the target itself is CI's).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devtools.sandbox.provider import FakeProvider
from reviews.models import ReviewRequest
from tests.support.console import ensure_roles
from tests.support.demo import demo_env, manage
from tests.support.doc_commands import REPO, Block, all_blocks, steps
from tests.support.effects import PROVIDER_API_KEY
from workers.services.operations import needing_attention

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True, reset_sequences=True)]

# `make manage ARGS="…"` as manage.py with those arguments; any other make target is not run here.
PRELUDE = r"""
make() {
  if [ "${1-}" != manage ]; then echo "doc-test: only 'make manage' runs here, not: make $*" >&2; return 97; fi
  shift; local args=""
  for arg in "$@"; do case "$arg" in ARGS=*) args=${arg#ARGS=};; esac; done
  eval "manage.py $args"
}
"""


def shell_env(env: dict[str, str], bin_dir: Path) -> dict[str, str]:
    """``manage.py`` on PATH (the checkout's), and ``python`` the test's own (./manage.py's shebang)."""
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "manage.py"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "manage.py"}" "$@"\n')
    shim.chmod(0o755)
    return {**env, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"}


def bash(script: str, env: dict[str, str], *, strict: bool) -> subprocess.CompletedProcess[str]:
    flags = ["-e", "-x", "-o", "pipefail"] if strict else ["-o", "pipefail"]
    return subprocess.run(
        ["bash", *flags, "-c", PRELUDE + script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_block(block: Block, env: dict[str, str]) -> list[str]:
    """What went wrong running the block ([] when every command did what the document says)."""
    if not block.is_transcript:
        done = bash("\n".join(block.lines), env, strict=True)
        if done.returncode != 0:
            return [f"{block.where}: exit {done.returncode}\n{tail(done.stdout)}\n{tail(done.stderr)}"]
        return []
    problems: list[str] = []
    status = 0
    for step in steps(block):
        if step.command.strip() == "echo $?":
            if step.output != [str(status)]:
                problems.append(f"{block.where}: the previous command exited {status}, the document says {step.output}")
            continue
        done = bash(step.command, env, strict=False)
        status = done.returncode
        said = f"{block.where}: $ {step.command}"
        if step.expected_status == 0 and status != 0:
            problems.append(f"{said}\n  exit {status}\n{tail(done.stdout)}\n{tail(done.stderr)}")
        elif step.expected_status is None and status == 0:
            problems.append(f"{said}\n  succeeded; the document shows it failing ({step.output})")
        for message in step.expected_messages:
            if not any(message.search(line) for line in (done.stdout + done.stderr).splitlines()):
                problems.append(f"{said}\n  did not say {message.pattern!r}; it said:\n{tail(done.stderr or done.stdout)}")
    return problems


# A hang guard, not a bound: one manage.py start-up per documented command, about 80 s on an idle
# 2-core machine and 300 s beside five other xdist workers there (pyproject's 300 s is for one test).
@pytest.mark.timeout(900)
def test_every_documented_command_runs_against_the_demo(provider: FakeProvider, tmp_path: Path, redis_clean: None) -> None:
    ensure_roles()  # the roles migration's groups (a transactional test starts from an empty database)
    env = demo_env(tmp_path / "data", sandbox_url=provider.url, sandbox_port=provider.port, api_key=PROVIDER_API_KEY)
    seeded = manage("koala_demo", env=env)
    assert seeded.returncode == 0, seeded.stderr
    drained = manage("koala_worker", "--burst", env=env, timeout=180)
    assert drained.returncode == 0, drained.stderr[-2000:]
    # The demo the documents describe: alice's charges wait for reviews 1 and 2, one charge needs attention.
    reviews = {r.pk: (r.job.idempotency_key, r.state, r.requested_by) for r in ReviewRequest.objects.select_related("job")}
    assert reviews == {1: ("demo-order-2", "pending", "alice"), 2: ("demo-order-3", "pending", "alice")}
    assert needing_attention().count() == 1

    runnable = [block for block in all_blocks() if block.runs]
    assert len(runnable) >= 10, "the documents' examples were found"
    shell = shell_env(env, tmp_path / "bin")
    problems = [problem for block in runnable for problem in run_block(block, shell)]
    assert not problems, "\n\n".join(problems)
