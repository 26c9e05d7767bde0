"""Hosts that loaded different kind modules: two real worker processes serve ``contract.demo@1``
under different contracts (tests/contract_kinds_a.py and _b.py, by KOALA_JOB_KIND_MODULES). The
check names the kind and the hosts on the console's worker table and in ``koala_status``; workers
that agree raise nothing."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from tests.conftest import worker_env
from workers.models import WorkerExit, WorkerProcess
from workers.selectors.workers import contract_mismatches

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # worker subprocesses write the rows

MODULES = "workers.builtin_kinds,tests.{}"


def start(processes: Any, name: str, module: str) -> None:
    env = worker_env(KOALA_JOB_KIND_MODULES=MODULES.format(module))
    processes.worker("--name", name, env=env, name=name)


def wait_running(*names: str) -> None:
    from tests.conftest import wait_for

    for name in names:
        wait_for(
            lambda n=name: WorkerProcess.objects.filter(name=n, exit=WorkerExit.RUNNING, stopped_at__isnull=True).exists(),
            timeout=30,
            what=f"worker {name} running",
        )


def status_text() -> str:
    out = io.StringIO()
    try:
        call_command("koala_status", stdout=out)
    except CommandError:
        pass  # its exit status is the worst level found (no beat runs here: critical)
    return out.getvalue()


def test_two_hosts_serving_one_kind_under_different_contracts_are_named_on_the_worker_page_and_in_status(
    processes: Any, client: Any
) -> None:
    from django.contrib.auth.models import User

    from tests.support.console import ensure_roles

    start(processes, "host-a", "contract_kinds_a")
    start(processes, "host-b", "contract_kinds_b")
    wait_running("host-a", "host-b")
    a, b = (WorkerProcess.objects.get(name=n).contracts for n in ("host-a", "host-b"))
    assert a["contract.demo@1"] != b["contract.demo@1"]
    assert a["noop@1"] == b["noop@1"]  # the kinds both loaded from the same module agree

    [mismatch] = contract_mismatches(now=timezone.now())
    assert mismatch.kind == "contract.demo@1"
    assert sorted(w for _, workers in mismatch.hosts for w in workers) == sorted(
        f"{n} on {WorkerProcess.objects.get(name=n).hostname}" for n in ("host-a", "host-b")
    )

    text = status_text()
    [line] = [row for row in text.splitlines() if "contracts" in row]
    assert "warning" in line.lower() and "contract.demo@1" in line and "host-a" in line and "host-b" in line, text

    ensure_roles()
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/console/").content.decode()
    workers = page[page.index("<h2>Workers</h2>") :]
    warning = workers[workers.index('data-contract-mismatch="contract.demo@1"') :]
    warning = warning[: warning.index("</p>")]
    assert "host-a" in warning and "host-b" in warning


def test_hosts_that_loaded_the_same_modules_raise_no_warning(processes: Any) -> None:
    start(processes, "same-a", "contract_kinds_a")
    start(processes, "same-b", "contract_kinds_a")
    wait_running("same-a", "same-b")
    assert contract_mismatches(now=timezone.now()) == []
    [line] = [row for row in status_text().splitlines() if "contracts" in row]
    assert "ok" in line.lower(), line
