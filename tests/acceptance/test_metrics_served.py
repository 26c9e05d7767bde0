"""GET /metrics through a real uvicorn serving koala.asgi, with the token in a file (as a systemd
credential or a Compose secret gives it), a real worker and beat running jobs, and Prometheus'
own `promtool check metrics` reading the real scrape."""

from __future__ import annotations

import http.client
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics.models import CompletionTally
from tests.conftest import REPO, Processes, wait_for, worker_env
from tests.support.api_server import ApiServer
from tests.support.system_tools import require_tool
from workers.models import Job
from workers.services.jobs import JobSpec, enqueue_many

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "scrape-token-7f3a9c1e55b2"


def _get(server: ApiServer, authorization: str | None) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Host": "localhost", **({"Authorization": authorization} if authorization else {})}
    try:
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read().decode()
    finally:
        conn.close()


def _completions(text: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == "koala_job_completions":
            return sum(s.value for s in family.samples if s.labels.get("kind") == "noop" and s.labels["outcome"] == "succeeded")
    return 0.0


def test_a_served_scrape_with_a_token_file_passes_promtool(tmp_path: Path, processes: Processes) -> None:
    promtool = require_tool("promtool")
    token_file = tmp_path / "metrics-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    server = ApiServer(tmp_path, env={"KOALA_METRICS_TOKEN_FILE": str(token_file)})
    server.start()
    try:
        processes.worker()
        processes.beat()
        ids = [r.job_id for r in enqueue_many(specs=[JobSpec(kind="noop", input={"i": i}) for i in range(5)])]
        wait_for(lambda: Job.objects.filter(pk__in=ids, state="succeeded").count() == 5, what="the worker to run the jobs")

        assert _get(server, None)[0] == 401
        assert _get(server, "Bearer not-the-token")[0] == 401
        status, content_type, text = _get(server, f"Bearer {TOKEN}")
        assert status == 200, text
        assert content_type.startswith("text/plain; version=0.0.4")
        assert _completions(text) == 5
        assert "koala_up 1.0" in text

        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert (checked.stdout + checked.stderr).strip() == "", checked.stdout + checked.stderr  # no lint warning either

        # The beat's fold moves them into the tallies: the served counter stays 5.
        wait_for(lambda: "koala_metrics_fold_lag_seconds" in _get(server, f"Bearer {TOKEN}")[2], what="a scrape")
        wait_for(lambda: CompletionTally.objects.filter(kind="noop").exists(), timeout=60, what="the beat to fold")
        assert _completions(_get(server, f"Bearer {TOKEN}")[2]) == 5
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"KOALA_METRICS_TOKEN": TOKEN, "KOALA_METRICS_TOKEN_FILE": "/etc/hostname"},
            "KOALA_METRICS_TOKEN and KOALA_METRICS_TOKEN_FILE are both set",
        ),
        (
            {"KOALA_METRICS_TOKEN_FILE": "/nonexistent/metrics-token"},
            "KOALA_METRICS_TOKEN_FILE='/nonexistent/metrics-token' cannot be read",
        ),
    ],
)
def test_an_ambiguous_or_unreadable_token_setting_stops_start_up(extra: dict[str, str], said: str) -> None:
    env = worker_env(**extra)
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert said in done.stderr, done.stderr
    assert TOKEN not in done.stdout + done.stderr
