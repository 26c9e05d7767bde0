"""The shipped Prometheus rules and Grafana dashboard read as data, the metric names they may use,
and a real Prometheus server (Debian's ``prometheus`` binary) for the live test.

``CONTRACT_METRICS`` is the list of fixed metric names the metrics app serves (the contract: it
may add names, never rename these); a rule or panel that names anything else reads a series that
is not there, and silently never fires or stays empty. ``series_names`` adds what the exposition
format derives from a counter or histogram (``_bucket``, ``_sum``, ``_count``).

    server = PrometheusServer(tmp_path, target_port=koala_port, token="...", rule_files=[...])
    server.start()
    server.query("koala_up")        # the API's result list
    server.alerts()                 # /api/v1/alerts
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
ALERTS_FILE = PROMETHEUS_DIR / "koala-alerts.yml"
THRESHOLDS_FILE = PROMETHEUS_DIR / "koala-thresholds.yml"
RULE_TESTS = (PROMETHEUS_DIR / "koala-alerts.test.yml", PROMETHEUS_DIR / "koala-thresholds-missing.test.yml")
EXAMPLE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD_FILE = REPO / "deploy" / "grafana" / "koala-dashboard.json"
RUNBOOK = "docs/operations.md#alerts"

# kind: counter | gauge | histogram, as the contract states them.
CONTRACT_METRICS: dict[str, str] = {
    "koala_jobs": "gauge",
    "koala_jobs_due": "gauge",
    "koala_queue_oldest_due_age_seconds": "gauge",
    "koala_jobs_parked": "gauge",
    "koala_job_completions_total": "counter",
    "koala_job_failures_total": "counter",
    "koala_attempt_duration_seconds": "histogram",
    "koala_rejections_total": "counter",
    "koala_orphaned_leases": "gauge",
    "koala_budget_used": "gauge",
    "koala_budget_limit": "gauge",
    "koala_budget_used_ratio": "gauge",
    "koala_reviews_pending": "gauge",
    "koala_review_oldest_age_seconds": "gauge",
    "koala_operations_attention": "gauge",
    "koala_workers": "gauge",
    "koala_last_attempt_completed_timestamp_seconds": "gauge",
    "koala_last_operation_completed_timestamp_seconds": "gauge",
    "koala_breaker_trips_total": "counter",
    "koala_breaker_tripped": "gauge",
    "koala_pauses": "gauge",
    "koala_beat_last_tick_timestamp_seconds": "gauge",
    "koala_schedule_last_slot_timestamp_seconds": "gauge",
    "koala_schedule_next_slot_timestamp_seconds": "gauge",
    "koala_scrape_duration_seconds": "gauge",
    "koala_up": "gauge",
}
# A metric name in a PromQL expression (recorded series are koala:..., so never match).
METRIC_NAME = re.compile(r"\bkoala_[a-z_]+")


def series_names() -> set[str]:
    """Every series name the contract's metrics expose."""
    names = set()
    for name, kind in CONTRACT_METRICS.items():
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def metric_names(expr: str) -> set[str]:
    return set(METRIC_NAME.findall(expr))


def rule_groups(path: Path) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(path.read_text())["groups"]
    return groups


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups(ALERTS_FILE) for rule in group["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD_FILE.read_text())
    return loaded


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows' collapsed panels included."""
    found: list[dict[str, Any]] = []
    for panel in board.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel that is not a row."""
    queries = []
    for panel in panels(board):
        if panel.get("type") != "row":
            queries.extend((panel["title"], target["expr"]) for target in panel.get("targets", []))
    return queries


# Grafana's variables as a Prometheus query sees them once Grafana has substituted them: every
# queue (a regex, the dashboard's "All" value) and the rate window Grafana would pick for a 1 s scrape.
GRAFANA_VARIABLES = {
    "${queue:regex}": ".*",
    "$queue": ".*",
    "${queue}": ".*",
    "$__rate_interval": "1m",
    "${__rate_interval}": "1m",
    "$__interval": "15s",
    "${__interval}": "15s",
    "$__range": "1h",
}


def substitute(expr: str, variables: dict[str, str] = GRAFANA_VARIABLES) -> str:
    # Longest first, so "${queue:regex}" is replaced whole, before "$queue" could match a part.
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(name, variables[name])
    return expr


class PrometheusServer:
    """One real Prometheus scraping one Koala target on loopback every second, rules loaded."""

    def __init__(self, tmp_path: Path, *, target_port: int, token: str, rule_files: Iterable[Path]) -> None:
        # Here, not at the top: fleet imports the engine's models, which the unit tests of the
        # deploy files (reading data only) have no need of.
        from tests.support.fleet import free_port

        self.folder = tmp_path / "prometheus"
        self.folder.mkdir()
        self.port = free_port()
        self.target = f"127.0.0.1:{target_port}"
        token_file = self.folder / "koala-metrics.token"
        token_file.write_text(token + "\n")  # Prometheus trims surrounding whitespace, as a shell's echo leaves it
        token_file.chmod(0o600)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": "koala",
                    "metrics_path": "/metrics",
                    "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
                    "static_configs": [{"targets": [self.target]}],
                }
            ],
        }
        self.config_file = self.folder / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        path = self.folder / "prometheus.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, command: str = "prometheus", timeout: float = 30.0) -> None:
        log = open(self.folder / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [
                command,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready within {timeout}s:\n{self.log()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful API answer; an error answer raises with Prometheus's message."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise AssertionError(f"/api/v1/{path} {params}: {exc.code} {body.get('errorType')}: {body.get('error')}") from exc
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] in ("vector", "matrix") else [data]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def targets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return found
