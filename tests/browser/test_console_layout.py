"""Every console page fits a 1280 px window, with real records holding long values.

Records are made through Koala's services and runtime (in this process, against the loopback
provider, plus one registered worker subprocess) with the long values people really produce:
a long user name (it is the requester, the actor and the one logged in), long free text in
reasons, notes and error messages (with URLs and unbroken tokens), a long account slug, a long
budget name, a workflow run's long input and signal payload. Then Debian's chromium, at 1280 x 900,
follows every console link breadth first (a few URLs per list page's URL pattern, and every job,
review, budget and run's journal page) and checks on each page:

- no horizontal scroll: ``document.documentElement.scrollWidth <= clientWidth``;
- breadcrumbs read "Jobs > Job 11" with a space on both sides of the separator, never
  "Jobs >Job 11": a gap between every two crumbs;
- JSON in a table cell wraps between words, never inside one: its box is at least as wide as
  its longest token (up to 24 characters; longer tokens may break);
- no request of the page (stylesheets, the favicon, images) answers 4xx or 5xx.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.urls import Resolver404, resolve

from devtools.sandbox.provider import FakeProvider
from exports.models import Account, ExportState
from exports.services import cancel_export, grant_account_access, request_export
from flows.models import Run
from flows.services import send_signal, start_run
from tests.inprocess import drain_until, run_export, run_until
from tests.support.console import PASSWORD
from tests.support.console_scenarios import pending_review, shop, uncertain_charge
from tests.support.exports import YEAR, load_events
from tests.support.fleet import wait_workers_ready
from workers.services.budgets import create_budget, set_model_price
from workers.services.jobs import cancel_job, enqueue
from workers.services.pauses import pause, resume

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 900
PER_PATTERN = 3  # URLs fetched per URL pattern (query variants included), except per-object pages:
OBJECT_PAGES = {"console:job", "reviews:detail", "console:budget", "console:run"}  # every one of them
# A user name of the kind an SSO integration makes: long, and without a space to break at.
LONG_USER = "finance.operations.team-lead+emea-north@subsidiary-holdings.example.com"
LONG_SLUG = "northwind-traders-international-holdings-emea"
LONG_TEXT = (
    "customer asked to hold the order until finance confirms the PO; see "
    "https://tickets.example.com/browse/FIN-20931?focusedCommentId=8812341&page=com.atlassian.jira.plugin.system"
    " and ORDER-REF-2026-11-29-000042-EU-WEST-1-PRIMARY-REPLICA for the full thread"
)


def seed(provider: FakeProvider, settings: Any, export_root: Path, scratch: Path) -> User:
    viewer = User.objects.create_superuser(LONG_USER, f"lead@{LONG_SLUG}.example.com", PASSWORD)
    # Failed jobs with long messages and long operation parameters, target and error.
    leaky = enqueue(kind="tests.leaky", input={"note": LONG_TEXT, "customer_code": "C-1"}, created_by=LONG_USER).job_id
    run_until(leaky, "failed")
    run_until(enqueue(kind="terminal", input={"order": LONG_TEXT}).job_id, "failed")
    # Retried, then succeeded; a job held on an unserved queue; one cancelled with a long reason.
    run_until(enqueue(kind="demo.flaky", input={"succeed_on": 2}).job_id, "succeeded")
    enqueue(kind="noop", input={"note": LONG_TEXT}, queue="bulk", created_by=LONG_USER)
    cancel_job(job_id=enqueue(kind="noop", input={}, queue="bulk").job_id, actor=LONG_USER, reason=LONG_TEXT)
    # Side effects: a priced model call, a charge, one waiting for review, one needing attention.
    set_model_price(model="m-small", input_minor_per_mtok=150_000, output_minor_per_mtok=600_000, actor=LONG_USER)
    run_until(enqueue(kind="model.complete", input={"model": "m-small", "prompt": LONG_TEXT}).job_id, "succeeded")
    run_until(shop("o-layout-small", 1200, created_by=LONG_USER), "succeeded")
    pending_review(requested_by=LONG_USER)
    uncertain_charge(provider, settings)
    # Pauses (one live, one lifted) and budgets with long names, in another time zone.
    pause(scope="kind", target="demo.flaky", reason=LONG_TEXT, actor=LONG_USER)
    resume(pause_id=pause(scope="queue", target="exports", reason=LONG_TEXT, actor=LONG_USER).pk, actor=LONG_USER, note=LONG_TEXT)
    create_budget(
        name="marketing-model-calls-daily-eu-west-1",
        scope="kind",
        target="model.complete",
        timezone="America/Los_Angeles",
        spend_limit_minor=2_000_000,
        request_limit=10_000,
        actor=LONG_USER,
    )
    create_budget(name="all-spend", scope="global", timezone="Europe/Paris", spend_limit_minor=10_000_000, actor=LONG_USER)
    # Exports of an account with a long slug: succeeded, failed (row limit), cancelled, queued.
    account = Account.objects.create(slug=LONG_SLUG, name="Northwind Traders International Holdings (EMEA)")
    grant_account_access(account_id=account.pk, username=LONG_USER, actor="setup")
    load_events(account, rows=200)

    def export(**options: Any) -> int:
        return request_export(user=viewer, account_id=account.pk, date_from=YEAR[0], date_to=YEAR[1], **options).pk

    assert run_export(export()).state == ExportState.SUCCEEDED
    assert run_export(export(max_rows=10)).state == ExportState.FAILED
    cancel_export(export_id=export(), user=viewer, reason=LONG_TEXT)
    export()
    # Workflow runs (tests/flows_kinds.py): a ticket run through its wait, resumed by a signal with
    # a long payload (its journal: steps, attempts, spans, the signal), and a stranded hfan run
    # (its steps are served over HTTP, and no HTTP worker is registered).
    long_input = {"log": str(scratch / "runs.log"), "note": LONG_TEXT}
    ticket = start_run(definition="ticket", input=long_input, correlation_id=f"{LONG_SLUG}-ticket-2026-000042", actor=LONG_USER)
    drain_until(lambda: Run.objects.get(pk=ticket.run.pk).state == "waiting", what="the ticket run to wait")
    send_signal(run_id=ticket.run.pk, name="reviewer.approved", key=LONG_SLUG, payload={"note": LONG_TEXT}, actor=LONG_USER)
    drain_until(lambda: Run.objects.get(pk=ticket.run.pk).state == "succeeded", what="the ticket run to succeed")
    start_run(definition="hfan", input=long_input, actor=LONG_USER)
    return viewer


# What each page is measured for, in the page (one evaluate per page).
MEASURE = """() => {
  const doc = document.documentElement;
  const crumbs = [...document.querySelectorAll('ol.breadcrumbs li, div.breadcrumbs a')];
  const gaps = [];
  for (let i = 1; i < crumbs.length; i++) {
    const a = crumbs[i - 1].getBoundingClientRect(), b = crumbs[i].getBoundingClientRect();
    if (Math.abs(a.top - b.top) < 2) gaps.push([crumbs[i - 1].innerText, crumbs[i].innerText, b.left - a.right]);
  }
  const canvas = document.createElement('canvas').getContext('2d');
  const narrow = [];
  for (const pre of document.querySelectorAll('td pre')) {
    const style = getComputedStyle(pre);
    canvas.font = style.font;
    const tokens = pre.innerText.split(/\\s+/).filter(t => t.length <= 24);
    const longest = Math.max(0, ...tokens.map(t => canvas.measureText(t).width));
    const inner = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    if (inner + 1 < longest) narrow.push([pre.innerText.slice(0, 60), Math.round(inner), Math.round(longest)]);
  }
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  return {scroll: doc.scrollWidth, client: doc.clientWidth, gaps, narrow, links};
}"""


def console_pattern(path: str) -> str | None:
    """The URL name of a console page (None: not a console page, or not a page at all)."""
    if not path.startswith("/admin/console/"):
        return None
    try:
        match = resolve(path)
    except Resolver404:
        return None
    return str(match.view_name)


def test_every_console_page_fits_1280px_without_horizontal_scroll(
    browser: Any,
    live_server: Any,
    provider: FakeProvider,
    settings: Any,
    export_root: Path,
    processes: Any,
    screenshot_dir: Path,
    tmp_path: Path,
) -> None:
    # A registered worker (the dashboard's worker table), on a queue nothing is enqueued on.
    worker = processes.start("koala_worker", "--queues", "critical", "--name", f"{LONG_SLUG}.worker-0001", name="worker")
    viewer = seed(provider, settings, export_root, tmp_path)
    wait_workers_ready([worker])

    context = browser.new_context(base_url=live_server.url, viewport={"width": WIDTH, "height": HEIGHT})
    page = context.new_page()
    page.set_default_timeout(15_000)
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {urlsplit(r.url).path}") if r.status >= 400 else None)
    page.goto("/admin/login/?next=/admin/console/")
    page.fill("#id_username", viewer.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/console/")

    origin = live_server.url
    shots = screenshot_dir / "layout-1280"
    shots.mkdir(exist_ok=True)
    queue, seen, per_pattern = deque(["/admin/console/"]), {"/admin/console/"}, Counter[str]()
    problems: list[str] = []
    visited: list[str] = []
    while queue:
        path = queue.popleft()
        failed.clear()
        response = page.goto(path)
        assert response is not None
        if response.status != 200:
            problems.append(f"{path}: HTTP {response.status}")
            continue
        visited.append(path)
        found = page.evaluate(MEASURE)
        name = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
        if found["scroll"] > found["client"]:
            problems.append(f"{path}: scrolls sideways ({found['scroll']} px of content in {found['client']} px)")
        problems += [f"{path}: breadcrumbs {a!r} and {b!r} touch ({gap:.1f} px)" for a, b, gap in found["gaps"] if gap < 2]
        problems += [f"{path}: JSON {text!r} wraps inside a word ({w} px < {need} px)" for text, w, need in found["narrow"]]
        problems += [f"{path}: a request answered {line}" for line in failed]
        for href in found["links"]:
            parts = urlsplit(href)
            if f"{parts.scheme}://{parts.netloc}" != origin:
                continue
            link = parts.path + (f"?{parts.query}" if parts.query else "")
            pattern = console_pattern(parts.path)
            if pattern is None or link in seen or (per_pattern[pattern] >= PER_PATTERN and pattern not in OBJECT_PAGES):
                continue
            seen.add(link)
            per_pattern[pattern] += 1
            queue.append(link)
    context.close()

    assert not problems, "\n".join(problems)
    # The crawl reached every kind of console page, object pages included.
    names = {console_pattern(urlsplit(p).path) for p in visited}
    expected = {
        "console:dashboard", "console:jobs", "console:job", "console:failures", "console:exports", "reviews:queue",
        "reviews:detail", "console:attention", "console:pauses", "console:budgets", "console:budget",
        "console:runs", "console:run", "console:stranded",
    }  # fmt: skip
    assert expected <= names, expected - names
