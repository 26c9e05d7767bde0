"""The clients of the worker protocol on the paths the first round left untested, against a live
uvicorn process: the SDK's ``ctx.operation`` reconciling an uncertain call, its answer to a 429,
a stop pause reaching a running body, the Node example's unservable and cancelled leases, and
the SDK installed on its own (standard library only).

What a worker sent is counted by a loopback proxy in front of the server
(tests/support/counting_proxy.py); what a provider did, by the file the fake provider writes.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from koala_worker import ABSENT, ApiError, Client, OperationResult, OutcomeUnknown, Worker

from tests.acceptance.test_api_sdk_worker import enqueue, sdk_worker, serving
from tests.conftest import REPO, wait_for
from tests.kinds import effect, effect_lines
from tests.support.api_server import ApiServer
from tests.support.counting_proxy import CountingProxy
from tests.support.fleet import assert_engine_invariants, attempts, wait_all_terminal, wait_state
from tests.support.sdk import NODE_WORKER, SDK_SRC
from workers.models import Job, JobState, Operation, OperationState, Outcome
from workers.services import jobs, pauses

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # a live server reads the rows


# -- 1. ctx.operation: an uncertain call reconciled on the retry ------------------------------


class FakeProvider:
    """An idempotent provider kept in a file: ``call``/``lookup`` lines for every request it got,
    an ``effect`` line for every charge it made (one per key, like a real idempotency key)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def lines(self, what: str, key: str | None = None) -> list[list[str]]:
        return [line for line in effect_lines(self.path) if line[0] == what and (key is None or line[1] == key)]

    def charge(self, key: str, amount: int, attempt: int, *, commit: bool, answer: bool) -> OperationResult:
        effect(self.path, f"call {key} {attempt}")
        if commit and not self.lines("effect", key):
            effect(self.path, f"effect {key} {amount}")
        if not answer:
            raise OutcomeUnknown("read timed out")  # the request left; no answer came back
        return OperationResult(external_id=f"ch_{key[-8:]}", data={"charged": amount}, cost_minor=amount)

    def look_up(self, key: str, attempt: int) -> Any:
        effect(self.path, f"lookup {key} {attempt}")
        found = self.lines("effect", key)
        if not found:
            return ABSENT
        return OperationResult(external_id=f"ch_{key[-8:]}", data={"charged": int(found[0][2])}, cost_minor=int(found[0][2]))


def test_an_uncertain_operation_is_reconciled_on_the_retry_found_or_absent(
    api_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    provider = FakeProvider(tmp_path / "provider.log")

    def charge(ctx: Any, data: Any) -> dict[str, Any]:
        amount = data["amount"]
        # Attempt 1: the call times out. "committed": the provider charged anyway; "lost": it never got it.
        first = ctx.attempt == 1
        result = ctx.operation(
            "charge",
            kind="charge",
            params={"amount": amount, "customer": data["customer"]},
            amount_minor=amount,
            currency="EUR",
            target=data["customer"],
            estimate_minor=amount,
            perform=lambda key: provider.charge(
                key, amount, ctx.attempt, commit=not (first and data["case"] == "lost"), answer=not first
            ),
            reconcile=lambda key: provider.look_up(key, ctx.attempt),
        )
        return {"charged": result, "attempt": ctx.attempt}

    committed = enqueue("http.charge", amount=300, customer="c_1", case="committed")
    lost = enqueue("http.charge", amount=400, customer="c_2", case="lost")
    with serving(sdk_worker(api_server, worker_key, name="sdk-reconcile").register("http.charge", 1, charge)):
        wait_all_terminal([committed, lost], timeout=60)

    # Found: the retry's begin answered look_up, reconcile found the charge, perform was not called again.
    row = Job.objects.get(pk=committed)
    assert row.state == JobState.SUCCEEDED and row.attempts == 2, (row.state, row.error_message)
    [op] = Operation.objects.filter(job_id=committed)
    assert op.state == OperationState.RECONCILED and op.external_id == f"ch_{op.key[-8:]}"
    assert row.result == {"charged": {"charged": 300}, "attempt": 2}
    assert [line[1:] for line in provider.lines("call", op.key)] == [[op.key, "1"]]  # one request, attempt 1
    assert [line[1:] for line in provider.lines("lookup", op.key)] == [[op.key, "2"]]
    assert len(provider.lines("effect", op.key)) == 1
    assert [a.outcome for a in attempts(committed)] == [Outcome.RETRY, Outcome.SUCCEEDED]

    # Absent: the provider never got it, so the retry sends it once more under the same key.
    row = Job.objects.get(pk=lost)
    assert row.state == JobState.SUCCEEDED and row.attempts == 2, (row.state, row.error_message)
    [op] = Operation.objects.filter(job_id=lost)
    assert op.state == OperationState.SUCCEEDED and op.amount_minor == 400
    assert [line[1:] for line in provider.lines("lookup", op.key)] == [[op.key, "2"]]
    assert [line[1:] for line in provider.lines("call", op.key)] == [[op.key, "1"], [op.key, "2"]]
    assert [line[1:] for line in provider.lines("effect", op.key)] == [[op.key, "400"]]
    assert row.result == {"charged": {"charged": 400}, "attempt": 2}
    assert_engine_invariants()


# -- 2. a 429: the client raises it, the worker waits Retry-After ------------------------------


def test_the_client_raises_a_429_with_its_retry_after_and_nothing_changes(api_server: ApiServer, worker_key: str) -> None:
    first, second = enqueue(n=1), enqueue(n=2)
    client = Client(api_server.url, worker_key, timeout=10)
    reg = client.register(name="sdk-429", kinds=[{"name": "http.probe", "version": 1, "steps": []}], concurrency=1)
    assert reg.concurrency == 1
    [held] = client.acquire(reg.worker_id, max=1, wait_seconds=5)
    assert held.job_id == first
    with pytest.raises(ApiError) as refused:
        client.acquire(reg.worker_id, max=1, wait_seconds=0)
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (429, "concurrency_exceeded", 1.0)
    assert refused.value.transient  # a 429 is worth trying again as is
    with pytest.raises(ApiError) as too_many:
        client.acquire(reg.worker_id, max=2, wait_seconds=0)  # more than its concurrency at all
    assert (too_many.value.status, too_many.value.retry_after) == (429, 1.0)
    row = Job.objects.get(pk=second)
    assert row.state == JobState.QUEUED and row.attempts == 0  # the refused calls changed nothing
    assert len(attempts(first)) == 1


def test_every_acquire_past_the_concurrency_is_refused_not_only_every_other_one(api_server: ApiServer, worker_key: str) -> None:
    first, second = enqueue(n=1), enqueue(n=2)
    client = Client(api_server.url, worker_key, timeout=10)
    reg = client.register(name="sdk-one", kinds=[{"name": "http.probe", "version": 1, "steps": []}], concurrency=1)
    [held] = client.acquire(reg.worker_id, max=1, wait_seconds=5)
    assert held.job_id == first
    for _ in range(2):
        with pytest.raises(ApiError) as refused:
            client.acquire(reg.worker_id, max=1, wait_seconds=2)
        assert refused.value.status == 429
    row = Job.objects.get(pk=second)
    assert row.state == JobState.QUEUED and row.attempts == 0, (row.state, row.lease_holder)


def test_the_worker_waits_retry_after_on_a_429_instead_of_spinning(api_server: ApiServer, worker_key: str) -> None:
    ran: list[int] = []

    def echo(ctx: Any, data: Any) -> dict[str, Any]:
        ran.append(ctx.job_id)
        return {"echo": data}

    # A gateway in front of Koala refuses acquire with 429 and Retry-After: 1 (the server answers
    # a worker over its concurrency the same way); the proxy lets a test hold the 429 for a while.
    with CountingProxy(api_server.port) as proxy:
        proxy.refuse("/acquire", 429, retry_after=1)
        worker = Worker(Client(proxy.url, worker_key, timeout=10), concurrency=1, name="sdk-wait", shutdown_deadline=5)
        worker.register("http.probe", 1, echo)
        with serving(worker):
            wait_for(lambda: proxy.calls("/acquire", status=429), timeout=10, what="the worker's first 429")
            job_id = enqueue(n=1)
            # A window of 3 s with work due: a worker that ignored Retry-After would poll many times.
            assert not threading.Event().wait(3.0)
            refusals = len(proxy.calls("/acquire", status=429))
            assert 2 <= refusals <= 5, f"{refusals} acquire calls refused in 3 s: Retry-After: 1 was not waited"
            assert ran == [] and Job.objects.get(pk=job_id).state == JobState.QUEUED
            proxy.refuse(None)
            row = wait_state(job_id, JobState.SUCCEEDED, timeout=20)
    assert ran == [job_id] and row.result == {"echo": {"n": 1}} and row.attempts == 1
    assert proxy.calls("/register", status=200)  # it kept its registration: no re-register on a 429
    assert len(proxy.calls("/register")) == 1


# -- 3. a stop pause reaches a running body through the heartbeat --------------------------------


def test_a_stop_pause_stops_the_body_at_a_safe_point_and_the_job_runs_after_resume(
    api_server: ApiServer, worker_key: str
) -> None:
    started = threading.Event()
    saw_cancel = threading.Event()
    runs: list[int] = []

    def careful(ctx: Any, data: Any) -> dict[str, Any]:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            started.set()
            if ctx.cancelled.wait(30):
                saw_cancel.set()
            ctx.progress(page=3)
            ctx.checkpoint()  # raises StopRequested: the lease goes back at a safe point
        return {"page": ctx.progress_checkpoint.get("page"), "attempt": ctx.attempt}

    job_id = enqueue()
    with serving(sdk_worker(api_server, worker_key, name="sdk-pause").register("http.probe", 1, careful)):
        assert started.wait(20)
        pause = pauses.pause(scope="kind", target="http.probe", mode="stop", reason="incident", actor="operator")
        assert saw_cancel.wait(20), "the stop pause did not reach the body"
        wait_for(lambda: [a.outcome for a in attempts(job_id)] == [Outcome.INTERRUPTED], timeout=20, what="the release")
        row = Job.objects.get(pk=job_id)
        assert row.state == JobState.QUEUED and row.attempts == 0  # no attempt used
        assert row.progress == {"page": 3}
        assert runs == [1]  # paused: not handed out again
        pauses.resume(pause_id=pause.pk, actor="operator")
        row = wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=20)
    assert row.state == JobState.SUCCEEDED and row.attempts == 1
    assert row.result == {"page": 3, "attempt": 1}  # resumed from the checkpoint
    assert runs == [1, 1]
    assert [a.outcome for a in attempts(job_id)] == [Outcome.INTERRUPTED, Outcome.SUCCEEDED]
    assert_engine_invariants()


# -- 4. the Node example: a kind it has no body for, an operator's cancel mid-body ---------------

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")


def node_worker(url: str, key: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    full = {**os.environ, "KOALA_URL": url, "KOALA_API_KEY": key, "KOALA_CONCURRENCY": "2", **env}
    with open(log, "ab") as out:
        return subprocess.Popen(["node", str(NODE_WORKER)], cwd=REPO, env=full, stdout=out, stderr=subprocess.STDOUT)


def stop_node(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=20) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@needs_node
def test_the_node_example_fails_a_declared_kind_it_has_no_body_for_unservable(
    api_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    log = tmp_path / "node.log"
    served, missing = enqueue("http.probe", 1, n=1), enqueue("http.probe", 2, n=2)
    with CountingProxy(api_server.port) as proxy:
        proc = node_worker(
            proxy.url,
            worker_key,
            log,
            KOALA_KINDS="http.probe@1,http.probe@2",
            KOALA_NO_BODY="http.probe@2",
            KOALA_WORKER_NAME="node-nobody",
        )
        try:
            wait_state(served, JobState.SUCCEEDED, timeout=20)
            wait_for(
                lambda: any(a.outcome == Outcome.UNSERVABLE for a in attempts(missing)), timeout=20, what="an unservable attempt"
            )
        finally:
            stop_node(proc, log)
        fails = [json.loads(c.body) for c in proxy.calls("/fail")]
        completes = proxy.calls("/complete")
    row = Job.objects.get(pk=missing)
    assert row.state == JobState.QUEUED and row.attempts == 0 and row.result is None, (row.state, log.read_text())
    assert {a.outcome for a in attempts(missing)} <= {Outcome.UNSERVABLE, Outcome.INTERRUPTED}
    assert fails and {f["classification"] for f in fails} <= {"unservable", "released"}
    assert "unservable" in {f["classification"] for f in fails}
    assert len(completes) == 1  # the served kind only
    assert Job.objects.get(pk=served).result == {"echo": {"n": 1}}


@needs_node
def test_the_node_example_stops_on_an_operators_cancel_and_reports_nothing(
    api_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    log = tmp_path / "node.log"
    job_id = enqueue("http.probe", 1, delay_ms=60_000)
    with CountingProxy(api_server.port) as proxy:
        proc = node_worker(proxy.url, worker_key, log, KOALA_KINDS="http.probe@1", KOALA_WORKER_NAME="node-cancel")
        try:
            wait_state(job_id, JobState.RUNNING, timeout=20)
            [lease_call] = wait_for(lambda: proxy.calls("/heartbeat", status=200)[:1], timeout=20, what="a heartbeat")
            lease_path = lease_call.path.rsplit("/", 1)[0]
            jobs.cancel_job(job_id=job_id, actor="operator")
            wait_for(lambda: proxy.calls(f"{lease_path}/heartbeat", status=409), timeout=20, what="a 409 on the heartbeat")
            # The worker is still alive and polling: it takes the next job (the cancel did not stop it).
            after = enqueue("http.probe", 1, n=9)
            wait_state(after, JobState.SUCCEEDED, timeout=20)
            beats_then = len(proxy.calls(f"{lease_path}/heartbeat"))
        finally:
            stop_node(proc, log)
        rejected = [json.loads(c.body) for c in proxy.calls("/heartbeat", status=409)]
        about_lease = [c.path for c in proxy.calls(lease_path) if not c.path.endswith("/heartbeat")]
        beats_after = len(proxy.calls(f"{lease_path}/heartbeat"))
    assert about_lease == [], about_lease  # no complete, no fail, no operation about the cancelled lease
    assert beats_after == beats_then  # and no heartbeat after the 409
    assert rejected and all(r["lease_token"] for r in rejected)
    row = Job.objects.get(pk=job_id)
    assert row.state == JobState.CANCELLED and row.result is None
    [attempt] = attempts(job_id)  # one start only
    assert attempt.outcome == Outcome.CANCELLED and attempt.worker_id == "node-cancel"
    assert_engine_invariants()


# -- 5. the SDK installs and works on its own ----------------------------------------------------

DRAIN_SCRIPT = """
import importlib.metadata, json, sys
sys.path.insert(0, {target!r})
import koala_worker
from koala_worker import Client, Worker

print(json.dumps({{
    "file": koala_worker.__file__,
    "version": koala_worker.__version__,
    "dist_version": importlib.metadata.version("koala-worker"),
    "all": sorted(koala_worker.__all__),
    "missing": [name for name in koala_worker.__all__ if not hasattr(koala_worker, name)],
    "path": sys.path,
    "modules": sorted(m for m in sys.modules if not m.startswith("koala_worker")),
}}), flush=True)

Worker(Client({url!r}, {key!r}, timeout=10), concurrency=2, name="sdk-installed", shutdown_deadline=5).register(
    "http.echo", 1, lambda ctx, data: {{"echo": data, "sdk": koala_worker.__version__}}
).serve()
print("stopped", flush=True)
"""

PUBLIC = {"Client", "Worker", "Context", "OperationResult", "ABSENT", "Rejected", "ApiError", "RetryableError", "StepFailure"}


def imported_modules(package: Path) -> set[str]:
    """The top-level names of every absolute import in the package's modules."""
    found: set[str] = set()
    for source in package.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


def test_the_sdk_installs_alone_imports_only_the_standard_library_and_drains_jobs(
    api_server: ApiServer, worker_key: str, tmp_path: Path
) -> None:
    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the work tree.
    source = tmp_path / "sdk-src"
    shutil.copytree(SDK_SRC.parent, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    package = target / "koala_worker"
    assert (package / "__init__.py").is_file() and (package / "py.typed").is_file()
    assert sorted(p.name for p in target.iterdir() if not p.name.startswith("koala_worker")) == [], list(target.iterdir())

    outside = sorted(name for name in imported_modules(package) if name != "koala_worker" and name not in sys.stdlib_module_names)
    assert outside == [], f"koala_worker imports outside the standard library: {outside}"

    ids = [jobs.enqueue(kind="http.echo", version=1, input={"n": n}).job_id for n in range(3)]
    log = tmp_path / "installed.log"
    script = DRAIN_SCRIPT.format(target=str(target), url=api_server.url, key=worker_key)
    # -I: no PYTHON* variables, no user site, no script directory; -S: no site-packages either.
    # The one path added is the install target (PYTHONPATH cannot be used: -I ignores it).
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", script], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_all_terminal(ids, timeout=30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first, *rest = log.read_text().splitlines()
    report = json.loads(first)
    assert "stopped" in rest, log.read_text()
    assert Path(report["file"]).is_relative_to(target), report["file"]
    assert not any(str(REPO) in entry or "site-packages" in entry for entry in report["path"]), report["path"]
    version = tomllib.loads((SDK_SRC.parent / "pyproject.toml").read_text())["project"]["version"]
    assert report["version"] == report["dist_version"] == version
    assert report["missing"] == [] and PUBLIC <= set(report["all"])
    assert [m for m in report["modules"] if m != "__main__" and m.split(".")[0] not in sys.stdlib_module_names] == []
    for job_id, n in zip(ids, range(3), strict=True):
        row = Job.objects.get(pk=job_id)
        assert row.state == JobState.SUCCEEDED and row.result == {"echo": {"n": n}, "sdk": version}
        assert [a.worker_id for a in attempts(job_id)] == ["sdk-installed"]
