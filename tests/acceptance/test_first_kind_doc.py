"""README's "Your first job kind in five minutes" runs as written, against the test database.

The code block is saved as the module the section names, its `export` line registers it, and
every command of the second terminal runs verbatim through scripts/manage (the URLs point at the
test database and Redis, so it runs them there). `make run` is stood in for by what it runs for
this: a worker with the same environment (`scripts/manage koala_worker --burst`), started after
the enqueue. The console's pages are then read as a superuser.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from tests.conftest import REPO, database_url_for_subprocess
from workers.models import Job, Operation

# transaction=True: the commands and the worker run in subprocesses, which must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TITLE = "## Your first job kind in five minutes"


def section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index(TITLE)
    end = readme.find("\n## ", start + len(TITLE))
    return readme[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def shell(line: str, env: dict[str, str]) -> str:
    command = ["bash", "-euo", "pipefail", "-c", line]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    return done.stdout


def exported(line: str, env: dict[str, str]) -> None:
    words = shlex.split(line)
    assert words[0] == "export" and len(words) == 2, line
    name, _, value = words[1].partition("=")
    env[name] = value


def test_the_first_kind_section_runs_as_written(tmp_path: Path, redis_clean: None) -> None:
    text = section()
    module = re.search(r"Save this as `(\w+)\.py` in the checkout", text)
    assert module, text
    (code,) = blocks(text, "python")
    checkout = tmp_path / "checkout"  # the module beside the code, without writing into this repository
    checkout.mkdir()
    (checkout / f"{module[1]}.py").write_text(code)
    data_dir = tmp_path / "data"
    unset = ("DATABASE_URL", "REDIS_URL", "DEBUG", "SECRET_KEY", "KOALA_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(unset)}
    env |= {
        "DATABASE_URL": database_url_for_subprocess(),
        "REDIS_URL": settings.REDIS_URL,
        "KOALA_DATA_DIR": str(data_dir),
        "PYTHONPATH": str(checkout),
    }

    # Comment lines (the doc-command runner's "not run" marker) are not commands.
    first, second = ([line for line in block.strip().splitlines() if not line.startswith("#")] for block in blocks(text, "sh"))
    assert len(first) == 2 and first[1] == "make run", first
    run_env = dict(env)
    exported(first[0], run_env)
    assert module[1] in run_env["KOALA_JOB_KIND_MODULES"].split(",")

    beside_env = dict(env)
    exported(second[0], beside_env)
    enqueue, listing = second[1:]
    assert enqueue.startswith("scripts/manage koala_enqueue ") and listing.startswith("scripts/manage koala_jobs "), second
    job_id = int(shell(enqueue, beside_env).strip())
    assert int(shell(enqueue, beside_env).strip()) == job_id  # "the same --key returns the same job"

    shell("scripts/manage koala_worker --burst --queues default", run_env)  # make run's worker, for this job
    listed = shell(listing, beside_env)
    row = next(line for line in listed.splitlines() if line.split()[:1] == [str(job_id)])
    assert "hello.greet" in row and "succeeded" in row and " 1/3 " in row, listed

    job = Job.objects.get(pk=job_id)
    operation = Operation.objects.get(job_id=job_id)
    assert (operation.name, operation.state, operation.key) == ("card", "succeeded", "hello-ana:card")
    card = data_dir / "hello-cards" / "hello-ana:card.txt"
    assert card.read_text() == "Hello, Ana!\n"
    assert job.result == {"card": str(card)}

    # "the console shows it at …/admin/console/jobs/?kind=hello.greet: its page lists the card operation"
    url = re.search(r"<http://127\.0\.0\.1:8000(/admin/console/jobs/\?kind=hello\.greet)>", text)
    assert url, text
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("first-kind", password="x"))
    listing_page = client.get(url[1])
    assert listing_page.status_code == 200 and f"/admin/console/jobs/{job_id}/" in listing_page.content.decode()
    detail = client.get(f"/admin/console/jobs/{job_id}/").content.decode()
    assert "card" in detail and "hello-ana:card" in detail and "succeeded" in detail
