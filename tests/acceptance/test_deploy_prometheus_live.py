"""A real Prometheus (Debian's ``prometheus``) scrapes a live Koala with the shipped rules loaded.

Koala is served as in production (uvicorn, koala.asgi) with a metrics token; one real worker
serves the default queue and no beat runs. Prometheus scrapes /metrics on loopback every second
with the token read from a file (``authorization: credentials_file:``, as
deploy/prometheus/prometheus.yml does) and evaluates koala-thresholds.yml and koala-alerts.yml
every second. Then, through Prometheus's HTTP API: the key series hold what the jobs did, the
completions counter rises as more jobs finish, the beat alert fires (no beat was started) and
the backlog alert fires for a queue nobody serves, no other alert is firing, and every Grafana
panel's query evaluates without error.
"""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Processes, wait_for
from tests.kinds import effect_lines
from tests.support.api_server import ApiServer
from tests.support.fleet import wait_workers_ready
from tests.support.prometheus import (
    ALERTS_FILE,
    CONTRACT_METRICS,
    RUNBOOK,
    THRESHOLDS_FILE,
    PrometheusServer,
    dashboard,
    panel_queries,
    substitute,
)
from tests.support.system_tools import require_tool
from workers.models import Job, JobState
from workers.services.jobs import enqueue

# transaction=True: the served Koala and the worker read and write these rows on their own connections.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "live-prometheus-test-token-0123456789abcdef"


def rule_files(folder: Path) -> list[Path]:
    """The shipped rule files, copied; the copies differ in two stated ways only."""
    folder.mkdir()
    alerts = yaml.safe_load(ALERTS_FILE.read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            # The shipped for: is 1 min (beat) and 5 min (backlog); this test waits seconds, so the
            # copy fires as soon as the condition holds. Expressions, labels and annotations are
            # the shipped ones.
            if rule.get("alert") in {"KoalaBeatNotTicking", "KoalaQueueBacklogOld"}:
                rule["for"] = "0s"
    thresholds = yaml.safe_load(THRESHOLDS_FILE.read_text())
    [bulk] = [r for g in thresholds["groups"] for r in g["rules"] if r.get("labels", {}).get("queue") == "bulk"]
    # A queue's own backlog threshold, changed as docs/operations.md#thresholds says: 1 s for bulk.
    bulk["expr"] = "vector(1)"
    (folder / THRESHOLDS_FILE.name).write_text(yaml.safe_dump(thresholds, sort_keys=False))
    (folder / ALERTS_FILE.name).write_text(yaml.safe_dump(alerts, sort_keys=False))
    return [folder / THRESHOLDS_FILE.name, folder / ALERTS_FILE.name]


def scrape(server: ApiServer, token: str | None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Host": "localhost"} | ({"Authorization": f"Bearer {token}"} if token else {})
    try:
        conn.request("GET", "/metrics", headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        conn.close()


def values(prometheus: PrometheusServer, expr: str, by: str) -> dict[str, float]:
    return {sample["metric"].get(by, ""): float(sample["value"][1]) for sample in prometheus.query(expr)}


def scalar(prometheus: PrometheusServer, expr: str) -> float | None:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if result else None


def active_alerts(prometheus: PrometheusServer) -> list[dict[str, Any]]:
    return [alert for alert in prometheus.alerts() if alert["state"] in ("pending", "firing")]


def firing(prometheus: PrometheusServer, name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        alert
        for alert in active_alerts(prometheus)
        if alert["labels"]["alertname"] == name
        and alert["state"] == "firing"
        and all(alert["labels"].get(k) == v for k, v in labels.items())
    ]


def test_prometheus_scrapes_koala_evaluates_the_rules_and_every_panel(
    tmp_path: Path, processes: Processes, redis_clean: None
) -> None:
    command = require_tool("prometheus")
    koala = ApiServer(tmp_path, env={"KOALA_METRICS_TOKEN": TOKEN})
    koala.start()
    prometheus = PrometheusServer(tmp_path, target_port=koala.port, token=TOKEN, rule_files=rule_files(tmp_path / "rules"))
    try:
        # The endpoint wants the token: without it no scrape (Prometheus's below carries it).
        assert scrape(koala, None)[0] in (401, 403)
        status, body = scrape(koala, TOKEN)
        assert status == 200 and "koala_up 1.0" in body, body[:2000]
        # Every name the rules and the dashboard may read (the contract) is served, as its kind.
        typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
        missing = {name: kind for name, kind in CONTRACT_METRICS.items() if typed.get(name) != kind}
        assert not missing, f"served as {[(name, typed.get(name)) for name in missing]}, the contract says {missing}"

        worker = processes.worker("--name", "prom-w")
        wait_workers_ready([worker])
        log = str(tmp_path / "effects.log")
        for _ in range(5):
            enqueue(kind="probe", input={"log": log})
        for _ in range(2):
            enqueue(kind="terminal", input={})
        # Due on a queue no worker serves: its oldest due age grows from now.
        enqueue(kind="probe", input={"log": log}, queue="bulk")
        wait_for(
            lambda: Job.objects.filter(queue="default", state__in=[JobState.SUCCEEDED, JobState.FAILED]).count() == 7,
            timeout=30,
            what="the default queue's seven jobs to end",
        )

        prometheus.start(command)
        wait_for(lambda: scalar(prometheus, 'up{job="koala"}') == 1.0, timeout=30, what=f"a scrape:\n{prometheus.log()}")
        [target] = prometheus.targets()
        assert (target["health"], target["labels"]["job"]) == ("up", "koala"), target

        # The key series, as the jobs left them.
        assert scalar(prometheus, "koala_up") == 1.0
        assert scalar(prometheus, "koala_scrape_duration_seconds") is not None
        jobs = values(prometheus, 'koala_jobs{queue="default"}', "state")
        assert {state: jobs.get(state) for state in ("succeeded", "failed", "queued")} == {
            "succeeded": 5.0,
            "failed": 2.0,
            "queued": 0.0,
        }, jobs
        ages = values(prometheus, "koala_queue_oldest_due_age_seconds", "queue")
        assert ages["default"] == 0.0 and ages["bulk"] > 0.0, ages
        assert {"critical", "exports"} <= set(ages), "a series for every known queue"
        outcomes = values(prometheus, 'sum by (outcome) (koala_job_completions_total{queue="default"})', "outcome")
        assert (outcomes.get("succeeded"), outcomes.get("failed")) == (5.0, 2.0), outcomes
        assert values(prometheus, "sum by (kind) (koala_job_failures_total)", "kind") == {"terminal": 2.0}
        assert scalar(prometheus, 'sum(koala_attempt_duration_seconds_count{kind="probe",part="total"})') == 5.0
        workers = values(prometheus, "koala_workers", "state")
        assert set(workers) >= {"healthy", "idle", "stuck", "crash_looping", "lost"}, workers
        assert workers["idle"] + workers["healthy"] >= 1.0 and workers["crash_looping"] == 0.0, workers

        # The completions counter rises as more attempts end.
        before = scalar(prometheus, "sum(koala_job_completions_total)")
        assert before is not None
        for _ in range(3):
            enqueue(kind="probe", input={"log": log, "seconds": 0.2})
        wait_for(
            lambda: scalar(prometheus, "sum(koala_job_completions_total)") == before + 3,
            timeout=30,
            what="Prometheus to see three more completions",
        )
        assert len([line for line in effect_lines(log) if line[0] == "end"]) == 8
        rate = scalar(prometheus, "sum(rate(koala_job_completions_total[1m]))")
        assert rate is not None and rate > 0

        # No beat runs, so the beat alert fires; bulk's backlog is past its (lowered) threshold.
        wait_for(lambda: firing(prometheus, "KoalaBeatNotTicking"), timeout=30, what="KoalaBeatNotTicking to fire")
        wait_for(
            lambda: firing(prometheus, "KoalaQueueBacklogOld", queue="bulk"), timeout=30, what="bulk's backlog alert to fire"
        )
        [beat] = firing(prometheus, "KoalaBeatNotTicking")
        assert beat["labels"]["severity"] == "critical"
        assert beat["annotations"]["runbook_url"] == RUNBOOK and "koala_beat --status" in beat["annotations"]["description"]
        # Nothing else fires: the scrape works, the thresholds are loaded, default's backlog is under
        # its threshold. The error rate (2 of 10 attempts) may be pending: its for: is 10 minutes.
        assert prometheus.query("absent(koala:threshold_oldest_due_age_seconds:default)") == []
        for alert in active_alerts(prometheus):
            name = alert["labels"]["alertname"]
            if name == "KoalaErrorRateHigh":
                assert alert["state"] == "pending", alert
            else:
                assert name in {"KoalaBeatNotTicking", "KoalaQueueBacklogOld"}, alert
                assert alert["labels"].get("queue") in (None, "bulk"), alert

        # Every panel's query, as Grafana sends it once its variables are substituted.
        answered: dict[str, int] = {}
        for title, expr in panel_queries(dashboard()):
            answered[title] = max(answered.get(title, 0), len(prometheus.query(substitute(expr))))
        for title in (
            "Oldest due job age per queue",
            "Due jobs per queue",
            "Jobs by state",
            "Completions by kind",
            "Failures by kind",
            "Error ratio per queue",
            "Attempt duration p50 per part",
            "Attempt duration p95 per part",
            "Workers by state",
            "Last completion age",
            "Beat: time since last tick",
            "Scrape duration",
            "Scrape up",
        ):
            assert answered[title] > 0, f"{title}: no series"
        queue_values = prometheus.api("label/queue/values", **{"match[]": "koala_queue_oldest_due_age_seconds"})
        assert {"default", "bulk", "critical", "exports"} <= set(queue_values)
    finally:
        prometheus.stop()
        koala.stop()
