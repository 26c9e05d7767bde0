"""Issue 10, secrets: a job's declared-sensitive values, fragments of its prompt and document, and
credential-shaped strings never reach a failure record, an operation row, a log record, a page
or ``koala_job`` output, even where the body repeats them outside their own fields.

The secrets come from tests.planted (new each run). The ``leaky`` kind (tests/kinds.py) repeats
them everywhere a careless body could; the runtime is the real one, in this process.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from koala.redaction import MASK
from reviews.models import ReviewRequest
from tests.inprocess import drain, run_until
from tests.planted import Planted, planted
from tests.support.console import ensure_roles, make_user
from workers.models import Attempt, Job, Operation
from workers.services.jobs import enqueue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def secrets() -> Planted:
    return planted()


@pytest.fixture
def failed_leaky(secrets: Planted, redis_clean: None) -> Job:
    """A ``leaky`` job run to failure (two attempts) by the real runtime in this process."""
    job_id = enqueue(kind="leaky", input=secrets.job_input(), created_by="alice").job_id
    return run_until(job_id, "failed")


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-only"))
    return client


def _records(job_id: int) -> str:
    """Every column of every failure record and ledger row Koala keeps about the job, as text."""
    rows = {
        "job": list(Job.objects.filter(pk=job_id).values("error_class", "error_message", "park_detail", "parked_on")),
        "attempts": list(Attempt.objects.filter(job_id=job_id).values()),
        "operations": list(Operation.objects.filter(job_id=job_id).values()),
    }
    return json.dumps(rows, default=str)


def test_failure_records_mask_declared_values_and_their_fragments(failed_leaky: Job, secrets: Planted) -> None:
    attempts = list(Attempt.objects.filter(job_id=failed_leaky.pk).order_by("number"))
    assert [a.outcome for a in attempts] == ["retry", "failed"]
    assert Operation.objects.get(job_id=failed_leaky.pk, name="ask").state == "failed"
    records = _records(failed_leaky.pk)
    assert secrets.leaks(records) == [], records
    # Masked, not dropped: the messages still say what happened.
    assert "could not summarise [redacted]" in failed_leaky.error_message
    assert "the provider refused re [redacted]" in attempts[0].error_message


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def root_records() -> Iterator[_Records]:
    """What any handler on the root logger receives (after Koala's own, which filters)."""
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_log_records_of_an_attempt_mask_its_declared_values(
    secrets: Planted, redis_clean: None, root_records: _Records, capfd: pytest.CaptureFixture[str]
) -> None:
    job_id = enqueue(kind="leaky", input=secrets.job_input()).job_id
    run_until(job_id, "failed")
    out, err = capfd.readouterr()
    logged = "\n".join(root_records.lines)
    assert "quoting re [redacted]" in logged  # the body's lines were logged, masked
    assert secrets.leaks(logged) == [], logged
    assert secrets.leaks(out + err) == []


def _pages(job_id: int, client: Client) -> dict[str, str]:
    pages = {}
    for name, url in {
        "console job page": f"/admin/console/jobs/{job_id}/",
        "admin job page": f"/admin/workers/job/{job_id}/change/",
    }.items():
        response = client.get(url)
        assert response.status_code == 200, (name, response.status_code)
        pages[name] = response.content.decode()
    return pages


def test_job_pages_mask_declared_values_repeated_in_other_fields(
    failed_leaky: Job, secrets: Planted, superuser_client: Client
) -> None:
    assert secrets.declared in json.dumps(failed_leaky.progress)  # the checkpoint quotes the declared value
    pages = _pages(failed_leaky.pk, superuser_client)
    assert {name: secrets.leaks(html) for name, html in pages.items()} == {name: [] for name in pages}
    for name, html in pages.items():
        assert MASK in html and "checkpoint" in html, name


def test_koala_job_masks_declared_values_and_the_checkpoint(failed_leaky: Job, secrets: Planted) -> None:
    for args in ((), ("--json",)):
        out = StringIO()
        call_command("koala_job", str(failed_leaky.pk), *args, "--actor", "alice", stdout=out)
        text = out.getvalue()
        assert '"checkpoint"' in text or "checkpoint" in text  # the progress checkpoint is shown
        assert secrets.leaks(text) == [], (args, secrets.leaks(text))


def test_review_page_masks_declared_values_quoted_in_other_fields(secrets: Planted, redis_clean: None, tmp_path: Path) -> None:
    # tests.charge declares api_token sensitive; its charge above 5000 waits for review.
    job_id = enqueue(
        kind="tests.charge",
        input={
            "world": str(tmp_path / "world.log"),
            "amount": 7000,
            "api_token": secrets.declared,
            "prompt": secrets.prompt,
            "memo": secrets.quote(),
            "note": secrets.free_text(),
        },
    ).job_id
    drain()
    assert Job.objects.get(pk=job_id).park_reason == "waiting_review"
    review = ReviewRequest.objects.get(job_id=job_id)
    ensure_roles()
    client = Client()
    client.force_login(make_user("rosa", "reviewers"))
    response = client.get(f"/admin/console/reviews/{review.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    leaks = [leak for leak in secrets.leaks(html) if not leak.startswith("document")]  # no document in this input
    assert leaks == [], leaks
    assert MASK in html
