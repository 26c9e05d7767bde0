"""Without EMAIL_HOST nothing is delivered: a worker logs one line per email, and the message only at DEBUG.

The message used to be printed whole on the worker's stdout (about 20 lines per email, past the
redacting log handler), which pushed `make run`'s login off the screen.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import Processes
from tests.support.effects import effects_env
from workers.models import Job
from workers.services.jobs import enqueue

# transaction=True: worker subprocesses must see the rows.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BODY_LINE = "Welcome to Koala. Your account is ready."  # effects' "welcome" template


def send_one_email(processes: Processes, **env: str) -> str:
    job_id = enqueue(
        kind="email.send",
        input={"to": "ana@example.com", "subject": "Hello Ana", "template": "welcome", "context": {"name": "Ana"}},
    ).job_id
    assert "EMAIL_HOST" not in os.environ
    worker = processes.worker("--burst", env=effects_env(**env))
    assert worker.wait(timeout=60) == 0, processes.logs()
    assert Job.objects.get(pk=job_id).state == "succeeded", processes.logs()
    return processes.logs()


def test_at_info_an_email_is_one_line_without_its_body(processes: Processes) -> None:
    logs = send_one_email(processes)
    lines = [line for line in logs.splitlines() if "email" in line.lower() and "not delivered" in line]
    assert len(lines) == 1, logs
    summary = r"INFO koala\.mail email 'Hello Ana' to 1 recipient not delivered \(no EMAIL_HOST; .*\), Message-ID <koala\."
    assert re.search(summary, lines[0]), lines
    assert BODY_LINE not in logs and "Content-Transfer-Encoding" not in logs, logs


def test_at_debug_the_whole_message_is_logged(processes: Processes) -> None:
    logs = send_one_email(processes, LOG_LEVEL="DEBUG")
    assert BODY_LINE in logs and "X-Koala-Idempotency-Key" in logs, logs
