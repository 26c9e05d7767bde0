"""A workflow run from the console in Debian's chromium (Playwright) against a live server, with
a real worker subprocess running the steps: an operator starts a ``ticket`` run with the form,
watches its journal reach the reviewer's wait, a reviewer sends the approval signal from the
journal, and the journal then shows every step, the worker that ran it and the signal that
resumed the wait. What the browser shows is checked against the rows and the effect file (the
outside world's record: each step ran once)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from flows.models import Run, RunStep
from koala.models import AuditEvent
from tests.conftest import Processes
from tests.kinds import effect_lines
from tests.support.console import PASSWORD
from tests.support.fleet import wait_workers_ready
from workers.models import Attempt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _login(browser: Any, base_url: str, user: User) -> Any:
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto("/admin/login/?next=/admin/console/runs/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/console/runs/")
    return page


def _reload_until(page: Any, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while page.inner_text("#run-state") != state:
        assert time.monotonic() < deadline, f"the journal never said {state!r} (it says {page.inner_text('#run-state')!r})"
        time.sleep(0.3)
        page.reload()


def test_an_operator_starts_a_run_from_the_console_and_reads_its_journal(
    browser: Any,
    live_server: Any,
    processes: Processes,
    role_users: dict[str, User],
    tmp_path: Path,
    screenshot_dir: Path,
) -> None:
    wait_workers_ready([processes.worker()])
    log = tmp_path / "effects.log"
    operator = _login(browser, live_server.url, role_users["operator"])
    operator.select_option("#start-run-form select[name=definition]", "ticket")
    operator.fill("#start-run-form input[name=version]", "1")
    operator.fill("#start-run-form textarea[name=input]", json.dumps({"log": str(log), "ticket": "T-1"}))
    operator.fill("#start-run-form input[name=idempotency_key]", "browser-ticket-1")
    operator.click("#start-run-form button[type=submit]")
    operator.wait_for_url("**/admin/console/runs/*/")
    run = Run.objects.get(idempotency_key="browser-ticket-1")
    assert operator.url.endswith(f"/admin/console/runs/{run.pk}/")
    assert (run.definition, run.version, run.created_by) == ("ticket", 1, "olga")
    _reload_until(operator, "waiting")  # the worker ran classify; the run waits for its reviewer
    assert operator.locator('[data-step="approval"] .wait').inner_text().startswith("waiting")
    operator.screenshot(path=str(screenshot_dir / "run-journal-waiting.png"), full_page=True)

    reviewer = _login(browser, live_server.url, role_users["reviewer"])
    reviewer.goto(f"/admin/console/runs/{run.pk}/")
    assert reviewer.locator("#cancel-form").count() == 0  # cancelling is the operators'
    reviewer.fill("#signal-form input[name=name]", "reviewer.approved")
    reviewer.fill("#signal-form input[name=key]", "review-1")
    reviewer.fill("#signal-form textarea[name=payload]", '{"approved_by": "rita"}')
    reviewer.click("#signal-form button[type=submit]")
    reviewer.wait_for_selector("text=Signal reviewer.approved: resumed")
    _reload_until(reviewer, "succeeded")
    reviewer.screenshot(path=str(screenshot_dir / "run-journal-succeeded.png"), full_page=True)

    # What the journal shows is what the rows say: each step, its worker, the signal that resumed the wait.
    steps = {row.name: row for row in RunStep.objects.filter(run=run)}
    assert {name: row.state for name, row in steps.items()} == {
        "classify": "succeeded",
        "approval": "succeeded",
        "send": "succeeded",
    }
    for name in ("classify", "send"):
        attempt = Attempt.objects.get(job_id=steps[name].job_id)
        shown = reviewer.locator(f'[data-step="{name}"] .worker-id').inner_text()
        assert shown == attempt.worker_id and attempt.outcome == "succeeded"
        assert reviewer.locator(f'[data-step="{name}"] li.span[data-depth="0"]').count() == 1  # the attempt's span
    resumed = reviewer.locator('[data-step="approval"] .wait').inner_text()
    assert "resumed by signal reviewer.approved key review-1 from rita" in resumed
    assert '"approved_by": "rita"' in reviewer.locator('[data-step="send"] .step-output').inner_text()
    assert reviewer.locator('#run-signals [data-status="consumed"]').count() == 1
    # The outside world's record: each step's body ran exactly once.
    assert sorted(line[0] for line in effect_lines(str(log))) == ["classify", "send"]
    # Both people's reads of the journal are audited; the worker's are not.
    readers = set(
        AuditEvent.objects.filter(action="read", target_type="run", target_id=str(run.pk)).values_list("actor", flat=True)
    )
    assert readers == {"olga", "rita"}
    # The journal fits the 1280 px window.
    assert reviewer.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
