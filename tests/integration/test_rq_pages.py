"""django-rq's pages stay usable while real Koala workers are registered in Redis.

django-rq's worker page takes the worker's Redis key (``rq:worker:<name>``), but its own
breadcrumb links to the page by the worker's bare name; RQ then raised ``ValueError: Not a
valid RQ worker key`` (500) for every registered worker. Koala mounts django-rq's pages itself
(workers/rq_pages.py): the worker page takes a name or a key and answers 404 for a worker
Redis does not know, and worker names are ones django-rq can link to.
"""

from __future__ import annotations

from collections import deque

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.links import page_links
from tests.support.console import ensure_roles, make_user
from tests.support.fleet import rq_workers, wait_workers_ready
from workers import doorbell
from workers.models import WorkerProcess
from workers.rq_workers import InvalidWorkerName, KoalaSimpleWorker, check_worker_name
from workers.services.jobs import enqueue

pytestmark = pytest.mark.django_db(transaction=True)

RQ_PAGES = "/admin/django-rq/"


def _superuser() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("rq-root"))
    return client


def _crawl_rq_pages(client: Client, start: str) -> dict[str, int]:
    """Every django-rq page reachable by links from ``start`` (GET), with its status."""
    seen: dict[str, int] = {}
    todo = deque([start])
    while todo:
        url = todo.popleft()
        if url in seen:
            continue
        response = client.get(url)
        seen[url] = response.status_code
        if response.status_code == 200 and "html" in response.get("Content-Type", ""):
            for link in page_links(response.content.decode(), page=url):
                path = link.split("?")[0]
                # django-rq's pages, however Koala or django-rq mount them.
                if path.startswith((RQ_PAGES, "/admin/django_rq/")) and link not in seen:
                    todo.append(link)
    return seen


@pytest.mark.slow  # a koala_worker subprocess
def test_every_django_rq_page_a_superuser_reaches_from_the_admin_answers_with_a_koala_worker_registered(
    processes,  # type: ignore[no-untyped-def]
) -> None:
    worker = processes.worker()  # the default name: host.pid, as a plain `koala_worker` runs
    wait_workers_ready([worker])
    (name,) = rq_workers()
    # A doorbell that stays in Redis (no worker serves "bulk"), for the queue's job pages.
    enqueue(kind="noop", input={}, queue="bulk")
    client = _superuser()

    index = client.get("/admin/")
    entry = [link for link in page_links(index.content.decode(), page="/admin/") if "django-rq" in link or "django_rq" in link]
    assert entry, "the admin index links to django-rq's pages for a superuser"
    seen = _crawl_rq_pages(client, entry[0])

    broken = {url: status for url, status in seen.items() if status >= 500}
    assert not broken, broken
    worker_pages = [url for url in seen if "/workers/" in url and url.rstrip("/").endswith(name)]
    assert worker_pages and all(seen[url] == 200 for url in worker_pages), (worker_pages, seen)
    job_pages = [url for url, status in seen.items() if "/queues/" in url and status == 200 and url.count("/") >= 6]
    assert job_pages, seen
    page = client.get(worker_pages[0]).content.decode()
    assert name in page and "default" in page


def test_the_worker_page_takes_a_name_or_a_key_and_answers_404_for_an_unknown_worker(redis_clean: None) -> None:
    worker = KoalaSimpleWorker([doorbell.rq_queue("default")], connection=doorbell.redis_connection(), name="page-probe")
    worker.register_birth()  # what a starting worker writes to Redis (Koala's own override)
    try:
        client = _superuser()
        for ref in ("page-probe", "rq:worker:page-probe"):
            response = client.get(f"{RQ_PAGES}workers/0/{ref}/")
            assert response.status_code == 200, (ref, response.status_code)
            assert "page-probe" in response.content.decode()
        for unknown in ("gone", "rq:worker:gone", "rq:queue:default"):
            assert client.get(f"{RQ_PAGES}workers/0/{unknown}/").status_code == 404, unknown
        # A queue index beyond the configured queues is a missing page too.
        for url in ("queues/99/", "workers/99/", "workers/99/page-probe/", "queues/99/some-job/"):
            assert client.get(RQ_PAGES + url).status_code == 404, url
    finally:
        worker.register_death()


def test_django_rq_pages_are_for_superusers_and_no_role_is_shown_a_link_to_them(redis_clean: None) -> None:
    """Its pages can empty queues and delete messages: not for auditors, who change nothing."""
    ensure_roles()
    for role in ("operators", "reviewers", "auditors"):
        client = Client(raise_request_exception=False)
        client.force_login(make_user(f"rq-{role}", role))
        index = client.get("/admin/").content.decode()
        assert not [link for link in page_links(index, page="/admin/") if "django-rq" in link or "django_rq" in link], role
        assert client.get(RQ_PAGES).status_code == 403, role
        assert client.get(f"{RQ_PAGES}queues/0/").status_code == 403, role
        assert client.post(f"{RQ_PAGES}queues/0/empty/").status_code == 403, role
    anonymous = Client().get(RQ_PAGES)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("name", ["a/b", " ", "tab\there", "nul\x00", "x" * 201, "ünï", "rq:worker:x"])
def test_a_worker_name_django_rq_cannot_link_to_is_refused_before_anything_is_registered(name: str, redis_clean: None) -> None:
    assert check_worker_name(name) is not None
    worker = KoalaSimpleWorker([doorbell.rq_queue("default")], connection=doorbell.redis_connection(), name=name)
    with pytest.raises(InvalidWorkerName, match="invalid worker name"):
        worker.work(burst=True)
    assert not doorbell.redis_connection().keys("rq:worker*")
    assert not WorkerProcess.objects.exists()


@pytest.mark.parametrize("name", ["web-1.example.com.4242", "koala-host.worker-3", "w_1@host", "a"])
def test_ordinary_worker_names_are_accepted(name: str) -> None:
    assert check_worker_name(name) is None


def test_an_empty_worker_name_is_refused_too() -> None:
    # RQ itself turns an empty name into a random one; `koala_worker --name ''` must refuse it instead.
    assert "invalid worker name ''" in (check_worker_name("") or "")
