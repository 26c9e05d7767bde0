"""The shipped Grafana dashboard (deploy/grafana/koala-dashboard.json), read as data: a dashboard
Grafana imports or provisions as is (its Prometheus chosen by a datasource variable, not an
import-time input), every panel queries, and every query reads only metrics Koala serves and is
PromQL promtool parses.

Every query evaluated by a real Prometheus scraping a live Koala: tests/acceptance/test_deploy_prometheus_live.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus import (
    DASHBOARD_FILE,
    dashboard,
    metric_names,
    panel_queries,
    panels,
    series_names,
    substitute,
)
from tests.support.system_tools import require_tool

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_the_dashboard_is_json_grafana_reads() -> None:
    board = json.loads(DASHBOARD_FILE.read_text())
    assert board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    assert "__inputs" not in board, "a provisioned dashboard gets no import inputs: choose the datasource by variable"


def test_its_variables_are_the_prometheus_datasource_and_the_queue() -> None:
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "queue"}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    queue = variables["queue"]
    assert queue["type"] == "query" and queue["datasource"] == DATASOURCE
    assert queue["query"]["query"] == "label_values(koala_queue_oldest_due_age_seconds, queue)"
    assert queue["includeAll"] and queue["multi"] and queue["allValue"] == ".*"


def test_panel_ids_are_unique_and_every_panel_has_a_place_and_queries() -> None:
    found = panels(dashboard())
    ids = [panel["id"] for panel in found]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in found:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no query"
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"] == DATASOURCE, panel["title"]


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard()):
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_query_reads_only_metrics_koala_serves() -> None:
    known = series_names()
    for title, expr in panel_queries(dashboard()):
        unknown = metric_names(expr) - known
        assert not unknown, f"{title}: not in the contract: {unknown}"


def test_the_panels_the_issue_asks_for_are_there() -> None:
    queries = panel_queries(dashboard())
    exprs = " ".join(expr for _, expr in queries)
    for name in (
        "koala_queue_oldest_due_age_seconds",
        "koala_jobs",
        "koala_job_completions_total",
        "koala_job_failures_total",
        "koala_attempt_duration_seconds_bucket",
        "koala_rejections_total",
        "koala_budget_used_ratio",
        "koala_reviews_pending",
        "koala_review_oldest_age_seconds",
        "koala_workers",
        "koala_breaker_tripped",
        "koala_pauses",
        "koala_last_attempt_completed_timestamp_seconds",
        "koala_scrape_duration_seconds",
    ):
        assert name in metric_names(exprs), f"no panel reads {name}"
    quantiles = [expr for _, expr in queries if expr.startswith("histogram_quantile(")]
    assert any(q.startswith("histogram_quantile(0.5,") and "part" in q for q in quantiles)
    assert any(q.startswith("histogram_quantile(0.95,") and "part" in q for q in quantiles)
    # The queue variable narrows every query of a metric that has the queue label.
    for title, expr in queries:
        for name in ("koala_queue_oldest_due_age_seconds", "koala_jobs_due", "koala_job_completions_total"):
            if name in expr:
                assert f'{name}{{queue=~"$queue"}}' in expr, title


@pytest.mark.slow
def test_every_query_is_promql_promtool_parses(tmp_path: Path) -> None:
    """promtool parses a recording rule's expression: each panel query, variables substituted as
    Grafana would, becomes one (a query Prometheus would refuse fails here, not on the wall)."""
    rules = [
        {"record": f"koala:panel_{index}", "expr": substitute(expr)} for index, (_, expr) in enumerate(panel_queries(dashboard()))
    ]
    assert not any("$" in rule["expr"] for rule in rules), "every variable is substituted"
    (tmp_path / "panels.yml").write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    done = subprocess.run(
        [require_tool("promtool"), "check", "rules", "panels.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
