"""Issue 10, secrets in Sentry: the real SDK, configured by koala.settings from SENTRY_DSN, in a
real web process and a real worker process, sends its real (gzip) envelopes to a loopback
ingest endpoint (tests/fakes/sentry.py). At least one event must arrive, and no planted secret
may be anywhere in the bytes that left the process, nor in the process's own log output.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from secrets import token_hex
from urllib.parse import quote, urlencode

import pytest

from tests.conftest import Processes, wait_for, worker_env
from tests.fakes.sentry import FakeSentry
from tests.planted import Planted, planted
from tests.support.fleet import free_port, wait_state, wait_workers_ready
from workers.models import Attempt, Job, Operation
from workers.services.jobs import enqueue

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]  # runserver and worker subprocesses


@pytest.fixture
def sentry() -> Iterator[FakeSentry]:
    fake = FakeSentry().start()
    try:
        yield fake
    finally:
        fake.stop()


def _get(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _answers(url: str) -> bool:
    try:
        _get(url)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
    return True


def _check(sentry: FakeSentry, secrets: Planted, logs: str) -> None:
    raw = sentry.raw()
    assert "gzip" in sentry.encodings(), f"the SDK sent gzip envelopes ({sentry.encodings()})"
    assert not sentry.errors(), sentry.errors()
    assert secrets.leaks(raw) == [], f"in the Sentry envelopes: {secrets.leaks(raw)}"
    assert secrets.leaks(logs) == [], f"in the process's log output: {secrets.leaks(logs)}"


@pytest.mark.parametrize("debug", ["false", "true"])
def test_web_process_sends_sentry_events_without_secrets(processes: Processes, sentry: FakeSentry, debug: str) -> None:
    """(With DEBUG=true the error page itself shows the request: a developer's page, not a sink.
    Its logs and Sentry events are checked all the same.)"""
    secrets = planted()
    # A job whose kind declares fields sensitive: the failing view joins its redaction context
    # (as Koala's job pages do) and quotes its memo.
    job_id = enqueue(kind="leaky", input=secrets.job_input()).job_id
    port = free_port()
    env = worker_env(SENTRY_DSN=sentry.dsn, DJANGO_SETTINGS_MODULE="tests.web.settings", DEBUG=debug, ALLOWED_HOSTS="127.0.0.1")
    processes.start("runserver", "--noreload", f"127.0.0.1:{port}", env=env, name="web")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(f"{base}/admin/login/"), timeout=30, what="the web process to answer")

    query = urlencode(
        {
            "token": secrets.bearer_token,
            "key": secrets.project_key,
            "aws": secrets.aws_key,
            "repo": secrets.url,  # percent-encoded: a password inside an encoded URL
            "jwt": secrets.jwt,
            "card": secrets.card_spaces,  # urlencode writes its spaces as "+"
            "card2": secrets.card_dashes,
            "job": str(job_id),
        }
    )
    query += f"&card3={secrets.card_pct}&plain={quote(secrets.url, safe=':/@')}"
    cookie = f"cv{token_hex(12)}"
    headers = {
        "Authorization": f"Bearer {secrets.bearer_token}",
        "X-Debug": f"{secrets.project_key} {secrets.aws_key} {secrets.card_spaces}",
        "Referer": secrets.url,
        # A value of no known shape: only the request's redaction context knows it is a secret.
        "Cookie": f"tracking={secrets.jwt}; cardpref={secrets.card}; sessionid={cookie}",
        "User-Agent": f"agent {secrets.jwt}",
    }
    assert _get(f"{base}/_test/boom/?{query}", headers=headers) == 500
    form = urlencode(
        {"memo": secrets.quote(), "password": secrets.url_password, "card": secrets.card_spaces, "note": secrets.free_text()}
    ).encode()
    assert (
        _get(
            f"{base}/_test/boom/?job={job_id}",
            data=form,
            headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
        )
        == 500
    )

    events = sentry.wait_for_events(2, where=lambda e: "exception" in e)
    _check(sentry, secrets, processes.logs())
    assert cookie not in sentry.raw().decode() and cookie not in processes.logs()
    assert all(e.get("request", {}).get("query_string") for e in events), "the events carry the request (scrubbed)"
    assert any("[redacted]" in str(e["request"].get("data")) for e in events), "the form data is sent, scrubbed"


def test_worker_process_sends_sentry_events_without_secrets(processes: Processes, sentry: FakeSentry) -> None:
    secrets = planted()
    env = worker_env(SENTRY_DSN=sentry.dsn, LOG_LEVEL="DEBUG")
    worker = processes.worker("--name", "sentry-worker", env=env)
    processes.beat(env=env)  # rings for the retry of attempt 1
    wait_workers_ready([worker])
    job_id = enqueue(kind="leaky", input=secrets.job_input()).job_id
    assert wait_state(job_id, "failed", timeout=40).error_class == "ValueError"
    # Per attempt: "the model refused", "lookup failed" (log errors), the captured exception and message.
    sentry.wait_for_events(8)
    events = sentry.events()
    assert any("exception" in e for e in events) and any(e.get("extra") for e in events)
    assert any((e.get("breadcrumbs") or {}).get("values") for e in events), "breadcrumbs were sent (scrubbed)"
    _check(sentry, secrets, processes.logs())
    records = json.dumps(
        [
            list(Job.objects.filter(pk=job_id).values("error_message", "park_detail")),
            list(Attempt.objects.filter(job_id=job_id).values("error_message")),
            list(Operation.objects.filter(job_id=job_id).values("params", "error_message", "target")),
        ]
    )
    assert "[redacted]" in records and secrets.leaks(records) == [], records
