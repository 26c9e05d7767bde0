"""The public root, ``workers``: exactly its documented names, loaded lazily, and the kind handle.

``from workers import job_kind, OperationResult, …`` is the one import a kind's author needs
(docs/engine.md, "Writing a job kind"). Its ``__all__`` is held to the list below: a name added
or removed without updating it (and the docs) fails here.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest

import workers
from workers import kinds
from workers.errors import EnqueueError
from workers.handles import KindHandle
from workers.kinds import JobKind, KindPolicy
from workers.services.jobs import JobSpec

REPO = Path(__file__).resolve().parents[2]

EXPECTED = [
    "ABSENT",
    "MAX_PENDING_SIGNALS",
    "MAX_RUN_STATE_BYTES",
    "MAX_SIGNAL_PAYLOAD_BYTES",
    "MAX_STEPS",
    "Declined",
    "DefinitionError",
    "Delivery",
    "EnqueueError",
    "EnqueueResult",
    "JobContext",
    "JobKind",
    "JobSpec",
    "KindHandle",
    "Miss",
    "ModelPrice",
    "NotPerformed",
    "OperationResult",
    "OutcomeUnknown",
    "Processing",
    "ReconcileAnswer",
    "Retryable",
    "RetryableError",
    "StepFailure",
    "TerminalFailure",
    "Workflow",
    "applicable_budgets",
    "enqueue",
    "enqueue_many",
    "job_kind",
    "model_price",
    "price_tokens",
    "remote_kind",
    "workflow",
]


def test_the_root_exports_exactly_the_documented_names() -> None:
    assert workers.__all__ == EXPECTED
    assert dir(workers) == sorted(EXPECTED)
    assert set(workers._HOMES) == set(EXPECTED)  # each name has its home, and only these


def test_every_name_resolves_to_the_engines_own_object() -> None:
    for name in EXPECTED:
        module, attribute = workers._HOMES[name]
        assert getattr(workers, name) is getattr(importlib.import_module(module), attribute), name
    star: dict[str, Any] = {}
    exec("from workers import *", star)
    assert set(star) - {"__builtins__"} == set(EXPECTED)


def test_no_public_name_is_shadowed_by_a_submodule_and_submodules_still_import() -> None:
    submodules = {info.name for info in pkgutil.iter_modules(workers.__path__)}
    assert not submodules & set(EXPECTED)
    from workers import sql  # a submodule, not a public name: still importable from the package

    assert sql.__name__ == "workers.sql"
    with pytest.raises(AttributeError, match="no attribute 'job_knid'"):
        workers.job_knid


@pytest.mark.slow  # starts a Python process: the only way to see what importing the root loads
def test_importing_the_root_loads_no_model_before_django_is_set_up() -> None:
    probe = (
        "import sys, workers\n"
        "from django.apps import apps\n"
        "assert not apps.ready\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('workers.') or m.startswith('django.db'))\n"
        "print(loaded)\n"
        "assert loaded == [], loaded\n"
        "assert sorted(workers.__all__) == dir(workers)\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "koala.settings"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # starts a Python process: the kinds load once per process, at Django's setup
def test_the_in_tree_kinds_load_without_touching_a_deprecated_path() -> None:
    modules = "workers.builtin_kinds,effects.kinds,exports.jobs,workers.tasks_backend,tests.kinds"
    probe = "import django; django.setup(); from workers import kinds; print(' '.join(k.key for k in kinds.served()))"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "koala.settings", "KOALA_JOB_KIND_MODULES": modules}
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", probe],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    served = set(done.stdout.split())
    assert {"noop@1", "http.echo@1", "email.send@1", "export.csv@1", "django.task@1", "tests.charge@1"} <= served


# -- the docs ----------------------------------------------------------------------------------------

DOCS = [REPO / "README.md", REPO / "sdk" / "python" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The engine modules behind the root, named with a public name (`workers.kinds.remote_kind`).
BEHIND_THE_ROOT = re.compile(r"\bworkers\.(?:kinds|handles|context|ledger|errors|services\.jobs|services\.budgets)\.(\w+)")
OLD_PATHS_SECTION = re.compile(r"^### The old import paths\n.*?(?=^#)", flags=re.S | re.M)


def imported_from_behind_the_root(block: str) -> list[str]:
    """``from workers.X import NAME`` in a Python block, for each public NAME."""
    try:
        tree = ast.parse(textwrap.dedent(block))
    except SyntaxError:  # a fragment (a decorator without its function): read its import lines alone
        lines = [line.strip() for line in block.splitlines() if line.strip().startswith("from workers.")]
        tree = ast.parse("\n".join(lines))
    return [
        f"from {node.module} import {alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("workers.")
        for alias in node.names
        if alias.name in EXPECTED
    ]


def test_the_docs_take_every_public_name_from_the_root() -> None:
    wrong: list[str] = []
    for doc in DOCS:
        # docs/engine.md's section on the old paths names them on purpose.
        text = OLD_PATHS_SECTION.sub("", doc.read_text() + "\n#")
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
            wrong += [f"{doc.relative_to(REPO)}: {found}" for found in imported_from_behind_the_root(block)]
        wrong += [f"{doc.relative_to(REPO)}: {m[0]}" for m in BEHIND_THE_ROOT.finditer(text) if m[1] in EXPECTED]
    assert not wrong, "take these from the root, `from workers import …`: " + "; ".join(wrong)


def test_the_engine_doc_lists_every_public_name() -> None:
    engine = (REPO / "docs" / "engine.md").read_text()
    table = engine[engine.index("### The public names") : engine.index("### One vocabulary with the HTTP SDK")]
    named = {name for row in table.splitlines() if row.startswith("| ") for name in re.findall(r"`(\w+)", row.split("|")[2])}
    assert set(EXPECTED) <= named, f"docs/engine.md's table lacks {sorted(set(EXPECTED) - named)}"


# -- the handle ---------------------------------------------------------------------------------


@pytest.fixture
def declared() -> Any:
    made: list[tuple[str, int]] = []
    yield made
    for name, version in made:
        kinds.unregister(name, version)


def test_job_kind_returns_a_handle_that_calls_the_body_and_carries_the_kind(declared: list[tuple[str, int]]) -> None:
    declared.append(("unit.handle", 3))

    def greet(ctx: Any, data: dict[str, Any]) -> dict[str, Any]:
        """Greets."""
        return {"hello": data["name"]}

    handle = workers.job_kind("unit.handle", version=3, queue="bulk", sensitive_fields=["pin"], required_fields=["name"])(greet)
    assert isinstance(handle, KindHandle)
    assert handle(None, {"name": "Ana"}) == {"hello": "Ana"}  # a test calls the body directly, as before
    assert handle.kind is kinds.get("unit.handle", 3) and handle.kind.body is greet
    assert (handle.name, handle.version, handle.key) == ("unit.handle", 3, "unit.handle@3")
    assert (handle.kind.queue, handle.kind.sensitive_fields, handle.kind.required_fields) == (
        "bulk",
        frozenset({"pin"}),
        frozenset({"name"}),
    )
    assert (handle.__name__, handle.__doc__, handle.__wrapped__) == ("greet", "Greets.", greet)
    assert repr(handle) == "<KindHandle unit.handle@3>"


def test_a_policy_the_engine_cannot_honour_is_refused_at_declaration() -> None:
    with pytest.raises(ValueError, match="at_most_once kinds must have max_attempts=1"):
        workers.job_kind("unit.bad", delivery=workers.Delivery.AT_MOST_ONCE, max_attempts=2)(lambda ctx, data: None)
    assert kinds.get("unit.bad", 1) is None


def test_the_declarable_policy_is_every_field_of_a_kind_but_its_identity() -> None:
    fields = set(JobKind.__dataclass_fields__) - {"name", "version", "body", "remote"}
    assert set(KindPolicy.__annotations__) == fields


def test_a_remote_kind_has_a_handle_too_without_a_body(declared: list[tuple[str, int]]) -> None:
    declared.append(("unit.remote", 1))
    handle = workers.remote_kind("unit.remote", queue="default", max_attempts=2)
    assert isinstance(handle, KindHandle) and handle.kind.remote and handle.kind.max_attempts == 2
    assert workers.remote_kind("unit.remote", queue="default", max_attempts=2).kind is handle.kind  # imported twice
    assert repr(handle) == "<KindHandle unit.remote@1 (remote)>"
    with pytest.raises(RuntimeError, match="runs in HTTP workers"):
        handle(None, {})


def test_a_handles_spec_names_its_kind_and_version(declared: list[tuple[str, int]]) -> None:
    declared.append(("unit.spec", 2))
    handle = workers.job_kind("unit.spec", version=2)(lambda ctx, data: None)
    assert handle.spec({"n": 1}, key="k", priority=3, delay_seconds=4.0, queue="bulk", correlation_id="c") == JobSpec(
        kind="unit.spec",
        input={"n": 1},
        idempotency_key="k",
        version=2,
        queue="bulk",
        priority=3,
        delay_seconds=4.0,
        correlation_id="c",
    )
    assert handle.spec() == JobSpec(kind="unit.spec", input={}, version=2)
    # enqueue_many takes its own specs (a version left open becomes its own) …
    assert handle._own(JobSpec(kind="unit.spec", input={"n": 2})) == JobSpec(kind="unit.spec", input={"n": 2}, version=2)
    assert handle._own({"n": 3}) == JobSpec(kind="unit.spec", input={"n": 3}, version=2)
    # … and refuses another kind's, or another version's, before anything is stored.
    for foreign, named in ((JobSpec(kind="noop"), "noop"), (JobSpec(kind="unit.spec", version=1), "unit.spec@1")):
        with pytest.raises(EnqueueError, match=f"takes inputs or specs of unit.spec@2, not of {named}"):
            handle.enqueue_many([{"n": 1}, foreign])


# -- the old paths: working, warning once -----------------------------------------------------------


def test_the_old_decorator_still_works_and_warns_once_where_it_is_imported(declared: list[tuple[str, int]]) -> None:
    declared.extend([("unit.old", 1), ("unit.old_remote", 1)])
    with pytest.warns(DeprecationWarning) as caught:
        from workers.kinds import job_kind, remote_kind
    assert len(caught) == 2
    assert [str(w.message) for w in caught] == [
        "workers.kinds.job_kind is deprecated and goes in the next release: use `from workers import job_kind` "
        "(it returns a handle with .enqueue)",
        "workers.kinds.remote_kind is deprecated and goes in the next release: use `from workers import remote_kind` "
        "(it returns a handle with .enqueue)",
    ]
    assert {w.filename for w in caught} == {__file__}  # it points at the import, not at the engine

    def body(ctx: Any, data: dict[str, Any]) -> str:
        return "old"

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # using what was imported warns no more
        decorated = job_kind("unit.old", version=1, sensitive_fields=["pin"])(body)
        remote = remote_kind("unit.old_remote", version=1)
    # What they always returned: the bare body, and the JobKind.
    assert decorated is body and kinds.get("unit.old", 1) == JobKind(
        name="unit.old", version=1, body=body, sensitive_fields=frozenset({"pin"})
    )
    assert isinstance(remote, JobKind) and remote is kinds.get("unit.old_remote", 1) and remote.remote


def test_the_engines_own_names_warn_nothing_and_unknown_ones_are_still_errors() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from workers.kinds import JobKind, get, register  # noqa: F401

        with pytest.raises(AttributeError, match="no attribute 'job_kinds'"):
            kinds.job_kinds
