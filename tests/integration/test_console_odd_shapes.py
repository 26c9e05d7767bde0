"""Pages that any kind can break: records of unusual shapes answer, and show no secret.

A kind of one's own records what it likes (tests/support/odd_shapes.py): parameters with no
"currency", results that are lists or strings, numbers where other kinds keep text, huge values,
non-ASCII keys. Every console and admin page that shows them answers, for each role that may
open it, and none shows the declared-sensitive value buried in each shape or the pattern-shaped
secrets of the job's input. tests/acceptance/test_console_crawl.py crawls the same records among
all the others, following every link.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from tests.planted import planted
from tests.support.odd_shapes import odd_pages, seed_odd_shapes
from workers.models import Job, Operation

# transaction=True: the jobs run through the in-process runtime (tests/inprocess.py).
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow  # about 125 pages of large records, four logins: 20-25 s on the shared 2-core machine
def test_every_page_showing_odd_records_answers_and_masks_them(role_users: dict[str, User], redis_clean: None) -> None:
    secrets = planted()
    seeded = seed_odd_shapes(secret=secrets.declared, note=secrets.free_text())
    # The records really hold the shapes (and the secret, at rest, in the job's own input).
    assert Job.objects.get(pk=seeded.jobs[0]).input["secret"] == secrets.declared
    assert {type(job.result).__name__ for job in Job.objects.filter(pk__in=seeded.jobs, state="succeeded")} == {
        "NoneType",
        "list",
        "str",
        "int",
        "dict",
    }
    assert Operation.objects.filter(job_id__in=seeded.jobs, params__currency=978).exists()

    root = User.objects.create_superuser("root", "root@example.com", "pw-for-tests-only")
    problems = []
    pages = odd_pages(seeded)
    # Every page for the superuser; for the roles, whose templates differ by role (forms for
    # operators and reviewers, none for auditors), the console's lists and the pages of the jobs
    # that offer the most to act on: a failed one and the two parked ones.
    acted_on = {f"/admin/console/jobs/{pk}/" for pk in (seeded.jobs[1], *seeded.parked)}
    console = [
        url for url in pages if url.startswith("/admin/console/") and ("/jobs/" not in url or url in acted_on or "?" in url)
    ]
    visits = {"superuser": (root, pages), **{role: (role_users[role], console) for role in ("operator", "reviewer", "auditor")}}
    for who, (user, urls) in visits.items():
        client = Client(raise_request_exception=False)
        client.force_login(user)
        for url in urls:
            response = client.get(url)
            if response.status_code not in (200, 302, 403):
                problems.append(f"{who}: {url} answered {response.status_code}")
            if leaked := secrets.leaks(response.content):
                problems.append(f"{who}: {url} shows {leaked}")
    assert not problems, "\n".join(problems)

    # The same records through the commands.
    for job_id in seeded.jobs:
        out = StringIO()
        call_command("koala_job", str(job_id), "--json", "--actor", "ops", stdout=out)
        assert json.loads(out.getvalue())["id"] == job_id
        assert not secrets.leaks(out.getvalue()), job_id
    listing = StringIO()
    call_command("koala_jobs", "--kind", "tests.shapes", stdout=listing)
    assert not secrets.leaks(listing.getvalue())
