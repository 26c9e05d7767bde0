"""The shipped Prometheus files (deploy/prometheus/): promtool accepts the rules and the example
config, the rules' own unit tests pass (koala-alerts.test.yml: each alert fires in one case and
must not in another), and, read as data, every alert says how bad it is, what it means, what to
check first and where the runbook is, and reads only metrics Koala serves.

A real Prometheus scraping a live Koala with these rules is tests/acceptance/test_deploy_prometheus_live.py.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prometheus import (
    ALERTS_FILE,
    EXAMPLE_CONFIG,
    PROMETHEUS_DIR,
    REPO,
    RULE_TESTS,
    RUNBOOK,
    THRESHOLDS_FILE,
    alert_rules,
    metric_names,
    rule_groups,
    series_names,
)
from tests.support.system_tools import require_tool

SEVERITIES = {"critical", "warning"}
# A recorded threshold series: koala:threshold_<what>[:default].
THRESHOLD = re.compile(r"\bkoala:threshold_[a-z_]+(?::default)?")


def promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.slow
def test_promtool_check_rules_accepts_the_alerts_and_the_thresholds() -> None:
    done = promtool("check", "rules", THRESHOLDS_FILE.name, ALERTS_FILE.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == 2


@pytest.mark.slow
def test_promtool_test_rules_passes_every_case() -> None:
    done = promtool("test", "rules", *(path.name for path in RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(RULE_TESTS), done.stdout


@pytest.mark.slow
def test_promtool_test_rules_fails_a_wrong_expectation(tmp_path: Path) -> None:
    """The rule tests can fail: the same cases, expecting the beat alert from a healthy Koala."""
    for name in (ALERTS_FILE.name, THRESHOLDS_FILE.name):
        (tmp_path / name).write_text((PROMETHEUS_DIR / name).read_text())
    tests = yaml.safe_load(RULE_TESTS[0].read_text())
    healthy = tests["tests"][0]
    beat = next(case for case in healthy["alert_rule_test"] if case["alertname"] == "KoalaBeatNotTicking")
    beat["exp_alerts"] = [{"exp_labels": {"severity": "critical"}}]
    tests["tests"] = [healthy]
    (tmp_path / "wrong.test.yml").write_text(yaml.safe_dump(tests))
    done = promtool("test", "rules", "wrong.test.yml", cwd=tmp_path)
    assert done.returncode != 0 and "KoalaBeatNotTicking" in done.stdout + done.stderr


@pytest.mark.slow
def test_promtool_check_config_accepts_the_example_config(tmp_path: Path) -> None:
    # promtool opens the token file the config names; the example's path is the host's.
    token = tmp_path / "koala-metrics.token"
    token.write_text("a-token\n")
    config = EXAMPLE_CONFIG.read_text()
    assert "credentials_file: /etc/prometheus/koala-metrics.token" in config
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/koala-metrics.token", str(token)))
    for name in (ALERTS_FILE.name, THRESHOLDS_FILE.name):
        (tmp_path / name).write_text((PROMETHEUS_DIR / name).read_text())
    done = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    thresholds = sum(len(group["rules"]) for group in rule_groups(THRESHOLDS_FILE))
    assert f"SUCCESS: {thresholds} rules found" in done.stdout and f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_the_example_config_scrapes_koala_with_a_bearer_token_file_and_loads_both_rule_files() -> None:
    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    assert config["rule_files"] == [THRESHOLDS_FILE.name, ALERTS_FILE.name]
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == "koala"]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/etc/prometheus/koala-metrics.token"}
    assert "bearer_token" not in job and "credentials" not in job["authorization"]  # never the token itself


def test_every_alert_has_a_severity_a_summary_a_description_and_the_runbook_link() -> None:
    rules = alert_rules()
    assert len(rules) >= 15
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "alert names are unique"
    for rule in rules:
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        notes = rule["annotations"]
        assert notes["runbook_url"] == RUNBOOK, rule["alert"]
        assert notes["summary"].strip() and "\n" not in notes["summary"], rule["alert"]
        assert "First check:" in notes["description"], f"{rule['alert']}: name the first thing to check"
        assert re.fullmatch(r"\d+[sm]", rule["for"]), f"{rule['alert']}: a for: in seconds or minutes"


def test_the_runbook_anchor_is_the_alerts_heading_and_its_table_names_every_alert() -> None:
    doc = (REPO / RUNBOOK.split("#")[0]).read_text()
    headings = re.findall(r"^#+ (.+)$", doc, re.M)
    # GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens; "alerts" is
    # one heading's own (a second "Alerts" heading would be "alerts-1").
    anchors = [re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings]
    assert anchors.count("alerts") == 1 and "monitoring" in anchors
    section = doc.split("\n### Alerts\n", 1)[1].split("\n## ", 1)[0]
    rows = {match for match in re.findall(r"^\| `(Koala\w+)` \|", section, re.M)}
    assert rows == {rule["alert"] for rule in alert_rules()}, "one row per alert in docs/operations.md#alerts"


def test_every_metric_the_rules_read_is_one_koala_serves() -> None:
    known = series_names()
    used: set[str] = set()
    for path in (ALERTS_FILE, THRESHOLDS_FILE):
        for group in rule_groups(path):
            for rule in group["rules"]:
                names = metric_names(rule["expr"])
                name = rule.get("alert") or rule.get("record")
                assert names <= known, f"{path.name} {name}: not in the contract: {names - known}"
                used |= names
    # The alerts the issue asks for read these.
    assert {
        "koala_workers",
        "koala_queue_oldest_due_age_seconds",
        "koala_job_failures_total",
        "koala_job_completions_total",
        "koala_budget_used_ratio",
        "koala_breaker_tripped",
        "koala_review_oldest_age_seconds",
        "koala_beat_last_tick_timestamp_seconds",
        "koala_last_attempt_completed_timestamp_seconds",
        "koala_up",
    } <= used


def test_the_error_rate_is_a_rate_of_the_counters() -> None:
    [rule] = [rule for rule in alert_rules() if rule["alert"] == "KoalaErrorRateHigh"]
    for counter in ("koala_job_failures_total", "koala_job_completions_total"):
        assert re.search(rf"rate\({counter}\[\w+\]\)", rule["expr"]), counter


def test_every_threshold_an_alert_reads_is_recorded_and_watched() -> None:
    recorded = {rule["record"] for group in rule_groups(THRESHOLDS_FILE) for rule in group["rules"]}
    read = {name for rule in alert_rules() for name in THRESHOLD.findall(rule["expr"])}
    [missing] = [rule for rule in alert_rules() if rule["alert"] == "KoalaThresholdsMissing"]
    watched = set(THRESHOLD.findall(missing["expr"]))
    # Per-queue thresholds are optional (a queue without one uses the default); the rest must exist.
    assert read - {"koala:threshold_oldest_due_age_seconds"} == watched
    assert read <= recorded and recorded <= read


def _cases() -> list[tuple[str, bool]]:
    """(alert, fires) of every case in the rule tests."""
    found = []
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test["alert_rule_test"]:
                found.append((case["alertname"], bool(case.get("exp_alerts"))))
    return found


def test_every_alert_has_a_rule_test_where_it_fires_and_one_where_it_must_not() -> None:
    cases = _cases()
    for rule in alert_rules():
        assert (rule["alert"], True) in cases, f"{rule['alert']}: no case where it fires"
        assert (rule["alert"], False) in cases, f"{rule['alert']}: no case where it must not fire"


def test_rule_test_expectations_carry_the_annotations_promtool_compares() -> None:
    # promtool compares an expected alert's annotations whole: each expected alert states them.
    for path in RULE_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test["alert_rule_test"]:
                for expected in case.get("exp_alerts") or []:
                    notes: dict[str, Any] = expected["exp_annotations"]
                    assert notes["runbook_url"] == RUNBOOK, case["alertname"]
