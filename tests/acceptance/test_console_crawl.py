"""Every page a person can reach answers, shows no planted secret, and links only where it may.

Realistic records are made through Koala's own services and runtime (jobs that failed with
secrets in their messages, operations, reviews, needs-attention, pauses, budgets, exports, a
registered worker, jobs of a kind recording values of unusual shapes, workflow runs: one run to
its end through a wait and a signal, its steps' spans stored in traces_span, and one stranded),
with secrets of many
shapes planted, unique to this run, in declared-
sensitive input fields and in free text. Then a superuser, each console role and a staff user
without a role log in and follow every same-origin link from /admin/ and the console home
(breadth first, GET only), and also open every object page of every Koala model, the console's
per-object pages (each job, review, budget and run's journal), every export's download and
django-rq's pages. Each answer must be 200, 302,
403 or 404, never 500 (an export download may also answer 409, for an export that has not
succeeded: those downloads are fetched though never linked, and 410 for the one whose object was
removed from storage); no body may hold a planted secret; and no page may link a person to a
target that then refuses them (403) or hides from them (404). No generic admin link needs an
exception to that rule.

Bounds: at most CAP_PER_VIEW distinct URLs (query variants included) are fetched per URL
pattern in the link-following pass; per-object pages are fetched for every row regardless, so
object-level permissions are checked everywhere. A link whose pattern reached its cap is not
fetched, so the link rule holds for the links that were fetched (every per-object link among
them). Not pages, so not fetched: /static/, logout.
"""

from __future__ import annotations

import base64
import json
import random
import secrets
import string
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.auth.models import User
from django.test import Client
from django.urls import Resolver404, resolve, reverse

from api.keys import create_key
from devtools.sandbox.provider import FakeProvider
from exports.models import Export, ExportState
from exports.services import cancel_export, grant_account_access
from flows.models import Run, RunStep
from flows.services import send_signal, start_run
from reviews.models import ReviewRequest
from reviews.services import approve_review, reject_review
from tests.inprocess import drain_until, run_export, run_until
from tests.links import page_links
from tests.support.console_scenarios import shop, uncertain_charge
from tests.support.exports import People, load_events, request
from tests.support.fleet import wait_workers_ready
from tests.support.odd_shapes import seed_odd_shapes
from traces.models import Span, SpanKind
from workers.models import Budget, Job
from workers.services.budgets import create_budget, set_model_price
from workers.services.jobs import cancel_job, enqueue
from workers.services.pauses import pause, resume

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KOALA_APPS = ("workers", "exports", "reviews", "koala", "console", "api", "flows", "traces", "schedules")
CAP_PER_VIEW = 3
ALLOWED = {200, 302, 403, 404}
SKIPPED_PREFIXES = ("/static/", "/admin/logout/")


# -- planted secrets -----------------------------------------------------------------------------


def _luhn_card(prefix: str = "4") -> str:
    """A random 16-digit number that passes the Luhn check (what the redaction layer masks)."""
    digits = [int(c) for c in prefix] + [random.randrange(10) for _ in range(15 - len(prefix))]
    total = 0
    for index, digit in enumerate(reversed(digits)):
        total += (digit * 2 - 9 if digit * 2 > 9 else digit * 2) if index % 2 == 0 else digit
    return "".join(map(str, digits)) + str((10 - total % 10) % 10)


def _token(length: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


# The kinds (and the workflow) whose input has a field declared sensitive, each given a secret there.
DECLARING = ("boom", "tests.leaky", "shop", "tests.shapes", "secretive")


@dataclass(frozen=True)
class Planted:
    """This run's secrets: each shape as it is written into records, and the texts that must never show."""

    bearer: str  # an sk_live_ key, sent as "Authorization: Bearer <it>"
    sk_proj: str
    akia: str
    url_password: str  # inside https://deploy:<it>@host
    jwt: str
    card_spaces: str
    card_dashes: str
    card_plus: str  # "+" between the groups: a card number that went through a URL-encoded form
    declared: dict[str, str]  # kind -> the value of a field that kind declares sensitive

    @classmethod
    def new(cls) -> Planted:
        visa, mastercard, amex_like = _luhn_card("4"), _luhn_card("5"), _luhn_card("4")
        spaces = " ".join(visa[i : i + 4] for i in range(0, 16, 4))
        dashes = "-".join(mastercard[i : i + 4] for i in range(0, 16, 4))
        jwt = ".".join([_b64({"alg": "HS256", "typ": "JWT"}), _b64({"sub": _token(12), "run": _token(8)}), _token(43)])
        return cls(
            bearer=f"sk_live_{_token(24)}",
            sk_proj=f"sk-proj-{_token(40, string.ascii_letters + string.digits + '_-')}",
            akia="AKIA" + _token(16, string.ascii_uppercase + string.digits),
            url_password=_token(20),
            jwt=jwt,
            card_spaces=spaces,
            card_dashes=dashes,
            card_plus="+".join(amex_like[i : i + 4] for i in range(0, 16, 4)),
            declared={kind: f"{kind.split('.')[-1]}-{_token(18)}" for kind in DECLARING},
        )

    def free_text(self) -> str:
        """One paragraph with every pattern-shaped secret, as a person or a provider might write it."""
        return (
            f"retry with Authorization: Bearer {self.bearer}; key {self.sk_proj}; aws {self.akia}; "
            f"repo https://deploy:{self.url_password}@git.example.internal/app.git; session {self.jwt}; "
            f"card {self.card_spaces} or {self.card_dashes} or {self.card_plus}"
        )

    def never_shown(self) -> dict[str, str]:
        """Every text that must not appear in a body, with its shape's name (raw and URL-encoded)."""
        raw = {
            "bearer": self.bearer,
            "sk-proj": self.sk_proj,
            "AKIA": self.akia,
            "url password": self.url_password,
            "jwt": self.jwt,
            "jwt signature": self.jwt.rsplit(".", 1)[1],
            "card (spaces)": self.card_spaces,
            "card (spaces) digits": self.card_spaces.replace(" ", ""),
            "card (dashes)": self.card_dashes,
            "card (dashes) digits": self.card_dashes.replace("-", ""),
            "card (+)": self.card_plus,
            "card (+) digits": self.card_plus.replace("+", ""),
            **{f"declared {kind}": value for kind, value in self.declared.items()},
        }
        shown = dict(raw)
        for name, value in raw.items():
            for encoded in (quote(value, safe=""), quote_plus(value)):
                if encoded != value:
                    shown[f"{name} (URL-encoded)"] = encoded
        return shown


# -- the records ---------------------------------------------------------------------------------


@dataclass
class Seeded:
    lost_export: int  # succeeded, then its object vanished from storage: its download answers 410
    finished_run: int  # secretive: its journal has steps, spans, a consumed signal and an error
    stranded_run: int  # hfan@1: its first step is due and no live worker serves it
    secrets_at_rest: int  # jobs whose stored input really holds planted values (the pages had something to leak)


def seed(planted: Planted, people: People, provider: FakeProvider, settings: Any, export_root: Path, scratch: Path) -> Seeded:
    text = planted.free_text()
    # A job failing with secrets in its message (boom repeats its declared "card" and its "bearer").
    boom = enqueue(
        kind="boom",
        input={
            "card": planted.declared["boom"],
            "bearer": planted.bearer,
            "order": "A-1",
            # A declared value quoted inside a field nobody declared: masked there too.
            "memo": f"customer read {planted.declared['boom']} aloud",
        },
        created_by="alice",
    ).job_id
    run_until(boom, "failed")
    # An API key (its page shows the prefix; the raw key is never stored).
    create_key(name="crawl worker", scopes=["worker"], actor="root")
    # A body repeating free text and its declared field in an operation and its error message.
    leaky = enqueue(kind="tests.leaky", input={"note": text, "customer_code": planted.declared["tests.leaky"]}).job_id
    run_until(leaky, "failed")
    # Credentials under always-sensitive keys, one job waiting on a queue nobody serves, one cancelled.
    held = {"password": planted.url_password, "api_key": planted.sk_proj, "token": planted.jwt, "order": "B-2"}
    enqueue(kind="noop", input=held, queue="bulk", created_by="bob")
    cancelled = enqueue(kind="noop", input={**held, "order": "B-3"}, queue="bulk").job_id
    cancel_job(job_id=cancelled, actor="olga", reason=f"customer asked; {text}")

    # Reviews: a pending one, a rejected one and an approved (then sent) one, each with a declared description.
    def charge(reference: str) -> ReviewRequest:
        job = enqueue(
            kind="shop.order_and_charge",
            input={"reference": reference, "amount_minor": 6000, "currency": "EUR", "description": planted.declared["shop"]},
            # Identifiers are not free text: the key names the job, never carries what it is about.
            idempotency_key=f"crawl-{secrets.token_hex(4)}",
            created_by="alice",
        ).job_id
        run_until(job, "parked")
        return ReviewRequest.objects.get(job_id=job, state="pending")

    charge(f"o-pending {planted.akia}")
    reject_review(review_id=charge("o-rejected").pk, actor="rita", comment=f"looks wrong: {text}")
    approved = charge("o-approved")
    approve_review(review_id=approved.pk, actor="rita", comment=f"ok, verified with {planted.bearer}")
    run_until(approved.job_id, "succeeded")
    # An operation only a person can settle (stays on Needs attention), and ordinary shop jobs.
    uncertain_charge(provider, settings)
    run_until(shop("o-small", 1200), "succeeded")
    # A kind of one's own recording values of unusual shapes everywhere (no "currency" in its
    # operation's params, lists and strings for results, huge and non-ASCII values, nulls).
    seed_odd_shapes(secret=planted.declared["tests.shapes"], note=text)

    finished_run, stranded_run = seed_runs(planted, scratch)

    # Pauses: one active (its reason is on every admin page's banner), one lifted with a note.
    pause(scope="kind", target="demo.flaky", reason=f"provider incident: {text}", actor="olga")
    lifted = pause(scope="queue", target="exports", reason=f"maintenance {planted.sk_proj}", actor="olga")
    resume(pause_id=lifted.pk, actor="olga", note=f"done, rotated {planted.akia}")
    create_budget(name="daily", scope="global", spend_limit_minor=10_000_000, actor="olga")
    set_model_price(model="gpt-crawl", input_minor_per_mtok=150, output_minor_per_mtok=600, actor="olga")

    # Exports: succeeded (Aude is a member of acme too), lost from storage, failed, cancelled with a reason, queued.
    grant_account_access(account_id=people.acme.pk, username="aude", actor="root")
    load_events(people.acme, rows=300)
    assert run_export(request(people).pk).state == ExportState.SUCCEEDED
    lost = run_export(request(people).pk)
    (export_root / lost.output_key).unlink()
    assert run_export(request(people, max_rows=10).pk).state == ExportState.FAILED
    cancel_export(export_id=request(people).pk, user=people.alice, reason=f"wrong range, see {text}")
    request(people, user=people.bob, account_id=people.globex.pk)

    at_rest = sum(
        1
        for job in Job.objects.all()
        if any(value in json.dumps(job.input) for value in (planted.bearer, planted.jwt, *planted.declared.values()))
    )
    return Seeded(lost_export=lost.pk, finished_run=finished_run, stranded_run=stranded_run, secrets_at_rest=at_rest)


def seed_runs(planted: Planted, scratch: Path) -> tuple[int, int]:
    """Two workflow runs (tests/flows_kinds.py): ``secretive`` run to its end in this process, and
    a stranded ``hfan``; returns their ids."""
    text = planted.free_text()
    # secretive's input carries a secret (``api_key`` is always sensitive); its body repeats it in
    # a span's attribute, the run's state, its output, and its last step's error.
    finished = start_run(
        definition="secretive",
        version=1,
        input={"log": str(scratch / "secretive.log"), "api_key": planted.declared["secretive"]},
        actor="alice",
    ).run.pk
    drain_until(lambda: Run.objects.get(pk=finished).state == "waiting", what="the secretive run to wait")
    # A span as an HTTP worker's body reports it, under the step attempt's own span (the protocol
    # stores them redacted: this row holds the run's secret and a bearer token, so the journal
    # must mask again when it shows it).
    use = RunStep.objects.get(run_id=finished, name="use")
    attempt_span = Span.objects.get(job_id=use.job_id, kind=SpanKind.ATTEMPT)
    Span.objects.create(
        job_id=use.job_id,
        attempt_id=attempt_span.attempt_id,
        trace_id=attempt_span.trace_id,
        span_id="b" * 16,
        parent_id=attempt_span.span_id,
        kind=SpanKind.BODY,
        name=f"model.call {planted.bearer}",
        attributes={"memo": f"customer key {planted.declared['secretive']}", "note": text},
        usage={"input_tokens": 3},
    )
    # The wait consumes a signal whose payload holds a token (always sensitive) and free text.
    send_signal(run_id=finished, name="go", key="crawl-go", payload={"token": planted.jwt, "note": text}, actor="bob")
    drain_until(lambda: Run.objects.get(pk=finished).state == "failed", what="the secretive run to fail")
    # hfan's steps are served over HTTP, and no HTTP worker is registered: its first step stays
    # due with nothing to run it, and the stranded page lists the run.
    stranded = start_run(definition="hfan", version=1, input={"log": str(scratch / "hfan.log"), "note": text}, actor="alice")
    return finished, stranded.run.pk


# -- the crawl -----------------------------------------------------------------------------------


@dataclass
class Visit:
    status: int
    links: list[str] = field(default_factory=list)


@dataclass
class Crawl:
    who: str
    client: Client
    planted: dict[str, str]
    allowed_extra: dict[str, int]  # URL -> a further status it may answer (export downloads: 409, 410)
    visits: dict[str, Visit] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    capped: set[str] = field(default_factory=set)  # links not fetched: their pattern reached its cap
    per_view: Counter[str] = field(default_factory=Counter)

    def get(self, url: str) -> Visit:
        if url in self.visits:
            return self.visits[url]
        response = self.client.get(url)
        body = b"".join(response.streaming_content) if response.streaming else response.content
        visit = Visit(response.status_code)
        self.visits[url] = visit
        if visit.status not in ALLOWED and self.allowed_extra.get(url) != visit.status:
            self.problems.append(f"{self.who}: {url} answered {visit.status}")
        text = body.decode(errors="replace") + "\n" + response.get("Location", "")
        for shape, value in self.planted.items():
            if value in text:
                at = text.index(value)
                self.problems.append(f"{self.who}: {url} shows the planted {shape}: ...{text[max(0, at - 150) : at + 60]!r}")
        if visit.status == 200 and "text/html" in response.get("Content-Type", ""):
            visit.links = [link for link in page_links(body.decode(errors="replace"), page=url) if not skipped(link)]
        return visit

    def run(self, starts: list[str], every: list[str]) -> None:
        """Fetch every URL of ``every``; then breadth first over same-origin links from ``starts``
        and from those pages, at most CAP_PER_VIEW further URLs per URL pattern."""
        for url in every:
            self.get(url)
        todo = deque([*starts, *(link for url in every for link in self.visits[url].links)])
        while todo:
            url = todo.popleft()
            if url in self.visits:
                continue
            view = view_of(url)
            if self.per_view[view] >= CAP_PER_VIEW and url not in starts:
                self.capped.add(url)
                continue
            self.per_view[view] += 1
            todo.extend(link for link in self.get(url).links if link not in self.visits)

    def check_links(self) -> None:
        """No link leads its viewer to a page that refuses (403) or hides from (404) them."""
        for page, visit in list(self.visits.items()):
            for link in visit.links:
                target = self.visits.get(link)
                if target is None:
                    assert link in self.capped, (self.who, page, link)
                    continue
                if target.status in (403, 404):
                    self.problems.append(f"{self.who}: {page} links to {link}, which answers {target.status}")


def skipped(link: str) -> bool:
    return link.startswith(SKIPPED_PREFIXES)


def view_of(url: str) -> str:
    try:
        return resolve(url.split("?")[0]).view_name
    except Resolver404:
        return url


def object_pages() -> list[str]:
    """Every object page of every Koala model: the admin change page of each row, and the
    console's own page of each job, review, budget, plus each export's download."""
    urls = []
    for model in apps.get_models():
        if model._meta.app_label in KOALA_APPS and admin.site.is_registered(model):
            name = f"admin:{model._meta.app_label}_{model._meta.model_name}_change"
            urls += [reverse(name, args=[admin_quote(pk)]) for pk in model._default_manager.values_list("pk", flat=True)]
    urls += [reverse("console:job", args=[pk]) for pk in Job.objects.values_list("pk", flat=True)]
    urls += [reverse("reviews:detail", args=[pk]) for pk in ReviewRequest.objects.values_list("pk", flat=True)]
    urls += [reverse("console:budget", args=[pk]) for pk in Budget.objects.values_list("pk", flat=True)]
    urls += [reverse("console:run", args=[pk]) for pk in Run.objects.values_list("pk", flat=True)]
    urls += [reverse("exports:download", args=[pk]) for pk in Export.objects.values_list("pk", flat=True)]
    return urls


def unregistered_koala_models() -> set[str]:
    return {m._meta.label for m in apps.get_models() if m._meta.app_label in KOALA_APPS and not admin.site.is_registered(m)}


# A hang guard, not a bound: five logins crawl every page in this process, about 45 s on an idle
# 2-core machine and 330 s beside five other xdist workers there (pyproject's 300 s is for one test).
@pytest.mark.timeout(900)
def test_every_reachable_page_answers_shows_no_planted_secret_and_links_only_where_allowed(
    people: People,
    role_users: dict[str, User],
    provider: FakeProvider,
    settings: Any,
    export_root: Path,
    tmp_path: Path,
    processes,  # type: ignore[no-untyped-def]
) -> None:
    began = time.monotonic()
    # A real Koala worker registered in PostgreSQL and Redis (django-rq's pages list it); it
    # serves a queue nothing is enqueued on, so it leaves the records below as they are made.
    worker = processes.start("koala_worker", "--queues", "critical", name="worker")
    planted = Planted.new()
    seeded = seed(planted, people, provider, settings, export_root, tmp_path)
    wait_workers_ready([worker])
    assert seeded.secrets_at_rest >= 4, "the planted values are in the database: a page could show them"
    # Not in the admin at all, so no page of theirs to visit: customer rows, the roles' permission
    # holder, and spans (shown nested in each run's journal, which is visited).
    assert unregistered_koala_models() == {"exports.Event", "console.Console", "traces.Span"}
    seeded_at = time.monotonic()

    logins = {"superuser": people.root, **{role: role_users[role] for role in ("operator", "reviewer", "auditor", "norole")}}
    never_shown = planted.never_shown()
    per_object = object_pages()
    lost_download = reverse("exports:download", args=[seeded.lost_export])
    # Fetched for every export (object-level rights), though linked only for succeeded ones: the rest answer 409.
    not_ready = {
        reverse("exports:download", args=[pk]): 409
        for pk in Export.objects.exclude(state=ExportState.SUCCEEDED).values_list("pk", flat=True)
    }
    crawls = {}
    for who, user in logins.items():
        client = Client(raise_request_exception=False)
        client.force_login(user)
        crawl = Crawl(who, client, never_shown, allowed_extra={lost_download: 410, **not_ready})
        crawl.run(["/admin/", "/admin/console/"], every=[*per_object, "/admin/django-rq/"])
        crawl.check_links()
        crawls[who] = crawl

    for who, crawl in crawls.items():
        statuses = Counter(v.status for v in crawl.visits.values())
        print(f"{who}: {len(crawl.visits)} pages ({dict(sorted(statuses.items()))}), {len(crawl.capped)} links capped")
    print(f"seed {seeded_at - began:.1f}s, crawl {time.monotonic() - seeded_at:.1f}s, {len(per_object)} object pages per login")
    problems = [problem for crawl in crawls.values() for problem in crawl.problems]
    assert not problems, "\n".join(problems[:60])

    # The crawl really went places: every console page and every Koala admin list for the superuser,
    # django-rq's pages with the worker's own page; and what each role may not see it did not.
    root = crawls["superuser"].visits
    assert all(root[url].status == 200 for url in ("/admin/console/jobs/", "/admin/console/reviews/", "/admin/console/exports/"))
    lists = {
        reverse(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist")
        for m in apps.get_models()
        if m._meta.app_label in KOALA_APPS and admin.site.is_registered(m)
    }
    assert lists <= set(root), lists - set(root)
    assert any(url.count("/") == 6 and url.startswith("/admin/django-rq/workers/") and root[url].status == 200 for url in root)
    assert root[lost_download].status == 410
    for role in ("operator", "reviewer", "auditor"):
        assert crawls[role].visits["/admin/console/jobs/"].status == 200, role
        assert crawls[role].visits["/admin/django-rq/"].status == 403, role
    assert crawls["norole"].visits["/admin/console/"].status == 403
    # The runs pages were crawled with data: the list shows both runs, the finished run's journal
    # its steps with their spans nested (the seeded one masked), the stranded page the hfan run.
    journal, stranded = reverse("console:run", args=[seeded.finished_run]), reverse("console:stranded")
    runs = reverse("console:runs")
    for who in ("superuser", "operator", "auditor"):
        visits = crawls[who].visits
        assert all(visits[url].status == 200 for url in (runs, journal, stranded)), who
    assert reverse("console:run", args=[seeded.stranded_run]) in root
    shown = {url: crawls["superuser"].client.get(url).content.decode() for url in (runs, journal, stranded)}
    assert all(f'href="{reverse("console:run", args=[pk])}"' in shown[runs] for pk in (seeded.finished_run, seeded.stranded_run))
    use = shown[journal].split('data-step="use"')[1].split("<!-- end of step")[0]
    assert use.count('class="span"') >= 4 and "model.call [redacted]" in use, use  # attempt, lookup, inner, the seeded one
    assert f'data-run="{seeded.stranded_run}"' in shown[stranded] and "hfan.a@1" in shown[stranded]
