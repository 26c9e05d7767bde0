"""Bad input in a request never answers 500 and never changes a row.

PostgreSQL text cannot hold a NUL character: a NUL that reaches a query raises DataError, a
500. One middleware (koala.middleware.RejectNulBytesMiddleware) answers every such request
400 with a short message before any view runs; these tests send NUL through every channel a
view reads (path, query string of every admin list and console page, form body, cookies)
and other malformed GET values to the console's pages.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import Client

from console.views.jobs import FILTER_KEYS
from koala.models import AuditEvent
from workers.models import Job, Pause
from workers.services.jobs import enqueue

pytestmark = pytest.mark.django_db(transaction=True)

NUL = "\x00"


@pytest.fixture
def root_client(redis_clean: None) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root-nul"))
    return client


def _filter_params(model_admin: admin.ModelAdmin) -> list[str]:
    """The query parameters an admin list's filters and search read."""
    params = ["q", "o", "p"]
    for entry in model_admin.list_filter:
        if isinstance(entry, str):
            params += [entry, f"{entry}__exact", f"{entry}__id__exact"]
    return params


def admin_list_urls() -> list[str]:
    urls = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in {"workers", "exports", "reviews", "koala", "auth", "schedules"}:
            continue
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        urls += [f"{base}?{param}=%00" for param in _filter_params(model_admin)]
    return urls


CONSOLE_PARAMS = {
    "/admin/console/": ["refresh"],
    "/admin/console/jobs/": [*FILTER_KEYS, "page"],
    "/admin/console/failures/": ["window"],
    "/admin/console/exports/": ["page"],
    "/admin/console/pauses/": ["scope", "target", "tenant"],
    "/admin/console/attention/": ["page"],
    "/admin/console/budgets/": ["page"],
    "/admin/console/reviews/": ["page"],
}


def _refused(response: Any) -> bool:
    return response.status_code == 400 and b"NUL" in response.content


def _assert_refused(response: Any, url: str) -> None:
    assert _refused(response), (url, response.status_code, response.content[:200])


def test_a_nul_in_any_query_parameter_answers_400_on_every_admin_and_console_page(root_client: Client) -> None:
    enqueue(kind="noop", input={})  # a list with a row: filters really run
    urls = admin_list_urls() + [f"{page}?{param}=%00" for page, params in CONSOLE_PARAMS.items() for param in params]
    # The case found in the wild: an admin list filter whose NUL reached PostgreSQL (DataError, 500).
    assert "/admin/workers/job/?state=%00" in urls
    answered = {url: root_client.get(url) for url in urls}
    crashed = [url for url, response in answered.items() if response.status_code >= 500]
    assert not crashed, crashed
    wrong = {url: response.status_code for url, response in answered.items() if not _refused(response)}
    assert not wrong, wrong
    # The parameter's name counts as much as its value.
    _assert_refused(root_client.get("/admin/workers/job/?st%00ate=failed"), "name")


def test_a_nul_in_the_path_a_form_or_a_cookie_answers_400_and_changes_nothing(root_client: Client) -> None:
    job_id = enqueue(kind="noop", input={}).job_id
    audit_rows = AuditEvent.objects.count()
    for url in ("/admin/workers/job/%00/change/", f"/admin/console/jobs/{job_id}%00/", "/exports/%00/download/"):
        _assert_refused(root_client.get(url), url)
    posts = [
        ("/admin/workers/job/", {"action": "cancel_jobs", "_selected_action": [f"{job_id}{NUL}"]}),
        (f"/admin/console/jobs/{job_id}/act/", {"action": "cancel", "reason": f"gone{NUL}"}),
        ("/admin/console/pauses/new/", {"scope": "queue", "target": "bulk", "mode": "drain", "reason": f"incident{NUL}"}),
    ]
    for url, data in posts:
        _assert_refused(root_client.post(url, data), url)
    assert Job.objects.get(pk=job_id).state == "queued"
    assert not Pause.objects.exists()
    assert AuditEvent.objects.count() == audit_rows

    root_client.cookies["koala_probe"] = f"a{NUL}b"
    _assert_refused(root_client.get("/admin/console/"), "cookie")


def test_malformed_get_values_on_console_pages_never_answer_500(root_client: Client) -> None:
    enqueue(kind="noop", input={})
    values = ["²", "-1", "0", "1e999", "nan", "9" * 40, "x" * 5000, "%FF%FE", "%ED%A0%80", "2026-13-45T99:99", "'; --"]
    for page, params in CONSOLE_PARAMS.items():
        for param in params:
            for value in values:
                url = f"{page}?{param}={value}"
                response = root_client.get(url)
                assert response.status_code in (200, 302, 400), (url, response.status_code)
    # A form's number that str.isdigit() accepts and int() refuses.
    bulk = root_client.post("/admin/console/jobs/bulk/", {"action": "cancel", "scope": "selected", "ids": ["²"]})
    assert bulk.status_code in (302, 400), bulk.status_code
