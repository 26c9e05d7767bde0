"""Hand-written SQL has its homes (workers/sql.py; an app's own tables: APP/sql.py) and one fence predicate.

Static checks, no database:

- every call in shipped code that hands SQL to PostgreSQL (``cursor.execute`` / ``executemany``
  / ``copy`` / ``mogrify``, ``Manager.raw``, ``RawSQL``, psycopg's ``pgconn.send_query`` …) is
  handed a statement of a SQL home, ``sql.NAME`` (``sql.NAME[…]``, ``sql.function(…)``), where
  ``sql`` is imported from ``workers.sql`` or from the calling app's own ``APP/sql.py``; never a
  literal, an f-string, a concatenation or another module's text; ``.extra(…)`` is refused
  outright. The few exceptions are listed in KNOWN_EXCEPTIONS, each with its reason;
- what each home holds: a statement of an app's home names only that app's tables; a
  statement of workers/sql.py that names an app's table names an engine table too (otherwise
  it belongs in that app's home);
- every workers.sql statement that writes ``workers_job`` or locks it for an attempt carries
  the live-lease predicate exactly as ``sql.LIVE_LEASE`` spells it, and it is spelled nowhere else.

Migrations are not scanned: each is the schema change of its moment and must never change
after it has run, so it cannot take its text from today's constants.
"""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.apps import apps

from workers import sql

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "workers"
# Every app import-linter knows (a new app must be added there), but the tests and benchmarks.
SHIPPED_APPS = tuple(
    name
    for name in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]
    if name not in {"tests", "bench"}
)
ENGINE_HOME = "workers.sql"
# The apps with a home of their own, for statements touching only their own tables.
APP_HOMES = ("reviews.sql", "exports.sql", "traces.sql")

# Methods that hand their first argument to PostgreSQL as SQL (psycopg's cursor and connection,
# Django's cursor and Manager.raw, psycopg's low-level pq connection).
EXECUTING = {"execute", "executemany", "copy", "mogrify", "raw", "send_query", "send_query_params", "exec_", "exec_params"}
STATEMENT_KEYWORDS = ("query", "sql", "statement")

# "file:function" -> why this function may hand PostgreSQL SQL that is not a SQL home's.
KNOWN_EXCEPTIONS = {
    "devtools/embedded.py:EmbeddedServices.ensure_database": (
        "administrative SQL on the embedded server's maintenance database, before Django's database exists: "
        "a pg_database lookup and CREATE DATABASE, whose name is an identifier no parameter can bind"
    ),
    "workers/prepared.py:PreparingCursor.execute": (
        "the cursor every session uses: it runs the statement its caller handed it, or that "
        "statement's prepared form from workers.sql.PREPARED (composed there from the statement itself)"
    ),
    "workers/prepared.py:PreparingCursor._prepare": (
        "runs workers.sql.PREPARED's PREPARE/DEALLOCATE of a statement (composed in workers/sql.py from it)"
    ),
    "exports/streaming.py:CopyReader.__enter__": (
        "runs the statement its caller hands CopyReader(statement=…); "
        "test_helpers_that_take_a_statement_are_only_given_home_ones checks those callers"
    ),
}

# Helpers that run a statement their caller chose: name -> where the statement is (a positional
# index, or a keyword). Only inside these may a parameter reach a cursor, and their callers
# must hand them a SQL home's statement.
STATEMENT_HELPERS: dict[str, int | str] = {
    "_claim": 0,
    "_execute": 0,
    "_ensure_usage": 1,
    "_update": 1,
    "CopyReader": "statement",
}
# Functions that choose a statement for a helper: each of their returns names a SQL home's
# statement first (``return sql.COMPLETE, {…}``), and a name assigned from their call
# (``statement, values = _statement(decision)``) may be handed to a helper.
STATEMENT_CHOOSERS = {"_statement"}  # workers.transitions: the fenced statement of a decision


def test_the_guard_scans_every_shipped_app() -> None:
    assert {"koala", "workers", "effects", "reviews", "exports", "console", "api", "devtools"} <= set(SHIPPED_APPS)
    assert not {"tests", "bench"} & set(SHIPPED_APPS)


def shipped_modules() -> list[Path]:
    return sorted(p for app in SHIPPED_APPS for p in (ROOT / app).rglob("*.py") if "migrations" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def homes_for(path: str) -> set[str]:
    """The SQL homes a module may take statements from: the engine's, and its own app's."""
    return {ENGINE_HOME, f"{path.split('/')[0]}.sql"}


def imported_names(tree: ast.AST) -> tuple[dict[str, str], set[str]]:
    """Name -> the dotted thing it is bound to (``from workers import sql`` binds ``sql`` to
    ``workers.sql``), and the names bound to modules by a plain ``import x`` (lazy imports count)."""
    bound: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = alias.name if alias.asname else name
                modules.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound, modules


def dotted(node: ast.expr, bound: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return bound.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, bound)
        return None if base is None else f"{base}.{node.attr}"
    return None


def home_of(arg: ast.expr, bound: dict[str, str]) -> str | None:
    """The module ``sql.NAME``, ``sql.NAME[...]`` or ``sql.function(...)`` takes its statement
    from (``sql`` resolved through the module's imports), or None for anything else."""
    if isinstance(arg, ast.Subscript):
        arg = arg.value
    if isinstance(arg, ast.Call):
        arg = arg.func
    if not isinstance(arg, ast.Attribute):
        return None
    return dotted(arg.value, bound)


def statement_of(call: ast.Call) -> ast.expr | None:
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in STATEMENT_KEYWORDS), None)


def strays(path: str, source: str) -> list[tuple[str, int, str]]:
    """(enclosing function, line, why) of every call in ``source`` that hands PostgreSQL SQL
    that is not a statement of one of ``path``'s SQL homes."""
    tree = ast.parse(source, filename=path)
    bound, modules = imported_names(tree)
    homes = homes_for(path)
    found: list[tuple[str, int, str]] = []

    def check(node: ast.Call, where: str, params: set[str], helper: bool) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "extra" and isinstance(func, ast.Attribute):
            found.append((where, node.lineno, "QuerySet.extra() is refused: RawSQL with a SQL home's statement"))
            return
        if name in EXECUTING and isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id in modules:
                return  # a module's function (copy.copy, shutil.copy), not a cursor's method
        elif name != "RawSQL":
            return
        arg = statement_of(node)
        if arg is None:
            return  # nothing handed over (dict.copy(), a Redis pipeline's execute())
        if home_of(arg, bound) in homes:
            return
        if helper and isinstance(arg, ast.Name) and arg.id in params:
            return  # a registered helper running the statement its caller chose
        found.append((where, node.lineno, ast.unparse(arg)[:80]))

    def visit(node: ast.AST, scope: list[str], params: set[str], helper: bool) -> None:
        if isinstance(node, ast.ClassDef):
            scope = [*scope, node.name]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            scope = [*scope, node.name]
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            params = {a.arg for a in arguments}
            helper = node.name in STATEMENT_HELPERS
        if isinstance(node, ast.Call):
            check(node, ".".join(scope) or "<module>", params, helper)
        for child in ast.iter_child_nodes(node):
            visit(child, scope, params, helper)

    visit(tree, [], set(), False)
    return found


def unexcepted(path: str, source: str) -> list[str]:
    return [f"{path}:{line}: {what}" for where, line, what in strays(path, source) if f"{path}:{where}" not in KNOWN_EXCEPTIONS]


@pytest.mark.parametrize("path", shipped_modules(), ids=rel)
def test_every_statement_comes_from_a_sql_home(path: Path) -> None:
    found = unexcepted(rel(path), path.read_text())
    assert found == [], (
        "hand-written SQL outside its home (workers/sql.py; an app's own tables: APP/sql.py; "
        "docs/architecture.md, 'SQL statement'):\n" + "\n".join(found)
    )


def test_every_known_exception_still_excepts_something() -> None:
    """An entry whose function no longer runs SQL of its own is stale: delete it."""
    excepted = {f"{rel(path)}:{where}" for path in shipped_modules() for where, _, _ in strays(rel(path), path.read_text())}
    stale = sorted(set(KNOWN_EXCEPTIONS) - excepted)
    assert stale == [], f"no longer hands PostgreSQL its own SQL, delete from KNOWN_EXCEPTIONS: {stale}"


def test_helpers_that_take_a_statement_are_only_given_home_ones() -> None:
    """A helper that executes a parameter is itself only ever handed a SQL home's statement."""
    calls, chosen, found = 0, 0, []
    for path in shipped_modules():
        tree = ast.parse(path.read_text())
        bound, _ = imported_names(tree)
        picked: set[str] = set()  # names assigned from a chooser's call
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in STATEMENT_CHOOSERS:
                for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return)):
                    first = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
                    chosen += 1
                    if first is None or home_of(first, bound) not in homes_for(rel(path)):
                        found.append(f"{rel(path)}:{ret.lineno}: {node.name} returns a statement of no SQL home")
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = node.value.func
                if isinstance(callee, ast.Name) and callee.id in STATEMENT_CHOOSERS:
                    target = node.targets[0]
                    first_target = target.elts[0] if isinstance(target, ast.Tuple) else target
                    if isinstance(first_target, ast.Name):
                        picked.add(first_target.id)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            at = STATEMENT_HELPERS.get(name)
            if at is None:
                continue
            if isinstance(at, int):
                arg = node.args[at] if len(node.args) > at else None
            else:
                arg = next((k.value for k in node.keywords if k.arg == at), None)
            if arg is None:
                continue
            calls += 1
            if home_of(arg, bound) not in homes_for(rel(path)) and not (isinstance(arg, ast.Name) and arg.id in picked):
                found.append(f"{rel(path)}:{node.lineno}: {ast.unparse(arg)[:80]}")
    assert calls >= 11 and chosen == 5 and found == [], found


# -- the checks can fail: planted SQL, as a module of console, reviews or workers would hold it ----


PLANTED = {
    "a literal": 'cursor.execute("SELECT 1 FROM workers_job")',
    "an f-string": 'cursor.execute(f"SELECT {column} FROM workers_job")',
    "a concatenation": 'cursor.executemany("UPDATE workers_job SET " + assignments, rows)',
    "a keyword literal": 'cursor.execute(query="SELECT 1")',
    "Manager.raw": 'Job.objects.raw("SELECT * FROM workers_job")',
    "RawSQL": 'RawSQL("SELECT id FROM workers_job", [])',
    "RawSQL by module": 'expressions.RawSQL(sql="SELECT id FROM workers_job", params=[])',
    "QuerySet.extra": 'Job.objects.extra(where=["state = %s"], params=["queued"])',
    "a COPY": 'cursor.copy("COPY workers_job TO STDOUT")',
    "pq": 'pgconn.send_query(b"SELECT 1")',
    "psycopg.sql": 'from psycopg import sql\ncursor.execute(sql.SQL("SELECT 1"))',
    "another app's home": "from exports import sql\ncursor.execute(sql.TRUNCATE_EVENTS)",
    "an unregistered helper": "def run(statement):\n    cursor.execute(statement)",
    "a home's text bound to a local": "from workers import sql\nstatement = sql.HOLD_LEASE\ncursor.execute(statement)",
}


@pytest.mark.parametrize("what", PLANTED)
def test_planted_sql_outside_a_home_is_found(what: str) -> None:
    found = unexcepted("console/selectors/planted.py", PLANTED[what])
    assert len(found) == 1 and found[0].startswith("console/selectors/planted.py:"), found


def test_a_home_statement_passes() -> None:
    source = textwrap.dedent(
        """
        import copy
        from django.db.models.expressions import RawSQL
        from reviews import sql as reviews_sql
        from workers import sql

        def read(cursor, names):
            cursor.execute(sql.DASHBOARD_LIVE_ATTEMPTS, [names])
            cursor.execute(sql.COUNT_RUNNING_IN_SCOPE[("queue", False)], {"target": "q"})
            cursor.execute(reviews_sql.APPROVAL_USED, [1, "k", "d"])
            copy.copy(names)
            return RawSQL(sql.DASHBOARD_LAST_FINISHED_ATTEMPTS, [names, None])

        def _claim(statement, params):
            cursor.execute(statement, params)
        """
    )
    assert unexcepted("reviews/planted.py", source) == []
    # The same module in console: reviews' own home is not console's.
    assert [line.split(": ", 1)[1] for line in unexcepted("console/planted.py", source)] == ["reviews_sql.APPROVAL_USED"]


# -- what each home holds --------------------------------------------------------------------------


def statements(module: ModuleType) -> dict[str, str]:
    """A home's statements by name: its public upper-case constants (a dict's values named NAME[key])."""
    found: dict[str, str] = {}
    for name, value in vars(module).items():
        if not name.isupper() or name.startswith("_"):
            continue
        if isinstance(value, str):
            found[name] = value
        elif isinstance(value, dict):
            found.update({f"{name}[{key!r}]": text for key, text in value.items() if isinstance(text, str)})
    if module is sql:
        found["insert_jobs(3)"] = sql.insert_jobs(3)
    return found


def tables_by_app() -> dict[str, set[str]]:
    owned: dict[str, set[str]] = {}
    for model in apps.get_models(include_auto_created=True):
        owned.setdefault(model._meta.app_label, set()).add(model._meta.db_table)
    return owned


def named_tables(text: str, tables: set[str]) -> set[str]:
    return set(re.findall(r"[a-z_][a-z0-9_]*", text)) & tables


def misplaced(home: str, texts: dict[str, str]) -> list[str]:
    """Statements ``home`` should not hold: in an app's home, one naming any table but the
    app's own; in workers/sql.py, one naming an app's table and no engine table."""
    owned = tables_by_app()
    every = set().union(*owned.values())
    engine = owned["workers"]
    wrong = []
    for name, text in texts.items():
        named = named_tables(text, every)
        if home == ENGINE_HOME:
            if named - engine and not named & engine:
                wrong.append(f"{name} names only {sorted(named - engine)}: it belongs in that app's sql.py")
        elif stray_tables := named - owned[home.split(".")[0]]:
            wrong.append(f"{name} names {sorted(stray_tables)}: it belongs in workers/sql.py")
    return wrong


@pytest.mark.parametrize("home", [ENGINE_HOME, *APP_HOMES])
def test_each_home_holds_only_its_statements(home: str) -> None:
    texts = statements(importlib.import_module(home))
    assert texts, home
    assert misplaced(home, texts) == []


def test_every_app_sql_module_is_a_listed_home() -> None:
    found = {f"{app}.sql" for app in SHIPPED_APPS if (ROOT / app / "sql.py").exists()}
    assert found == {ENGINE_HOME, *APP_HOMES}


def test_misplaced_statements_are_found() -> None:
    assert misplaced("exports.sql", {"SETTLE": sql.SETTLE_EXPORTS}) == [
        "SETTLE names ['workers_job']: it belongs in workers/sql.py"
    ]
    assert misplaced(ENGINE_HOME, {"USE": "UPDATE reviews_reviewrequest SET state = 'used'"}) == [
        "USE names only ['reviews_reviewrequest']: it belongs in that app's sql.py"
    ]
    assert misplaced(ENGINE_HOME, {"LOCK": sql.LOCK_JOB_OF_REVIEW}) == []


# -- the engine's statements -----------------------------------------------------------------------


def test_every_attempt_side_write_of_the_job_row_is_fenced_by_the_one_predicate() -> None:
    fenced = {"HOLD_LEASE", "HEARTBEAT", "COMPLETE", "RETRY_LATER", "FAIL", "PARK", "RELEASE", "ADD_OPERATION_USAGE"}
    engine = statements(sql)
    for name in fenced:
        assert sql.LIVE_LEASE in engine[name], name
    # A batch's statements fence each of their rows with the same predicate, spelled from it.
    batched = {"COMPLETE_MANY", "HEARTBEAT_MANY"}
    for name in batched:
        assert sql.LIVE_LEASE_ROW in engine[name], name
    # Spelled once: no other statement re-types (a variant of) the live-lease check.
    others = {name for name, text in engine.items() if "lease_expires_at > now()" in text}
    assert others == fenced | batched | {"LIVE_LEASE", "LIVE_LEASE_ROW"}


def test_the_strict_fence_locks_the_row_and_names_the_token() -> None:
    assert sql.HOLD_LEASE == (
        "SELECT 1 FROM workers_job WHERE id = %(job_id)s AND lease_token = %(lease_token)s "
        "AND state IS NOT DISTINCT FROM 'running' AND lease_expires_at > now() FOR NO KEY UPDATE"
    )


@pytest.mark.parametrize("home", [ENGINE_HOME, *APP_HOMES])
def test_statements_bind_values_and_leave_no_placeholder_unfilled(home: str) -> None:
    texts: dict[str, Any] = statements(importlib.import_module(home))
    for name, text in texts.items():
        # A leftover "{where}" means a template escaped its one composition at import.
        assert not re.search(r"\{[a-z_]+\}", text), name
        uses_named, uses_positional = "%(" in text, "%s" in text
        assert not (uses_named and uses_positional), f"{name} mixes %s and %(name)s"


def test_the_ledger_asks_the_review_gate_through_the_hooks_registry() -> None:
    tree = ast.parse((WORKERS / "ledger.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name == "reviews" or name.startswith("reviews.") for name in imported)
