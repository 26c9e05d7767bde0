"""The engine's hand-written SQL has one home (workers/sql.py) and one fence predicate.

Static checks, no database: every ``cursor.execute`` / ``.raw`` / ``cursor.copy`` in workers/
outside workers/sql.py is handed a statement from that module (``sql.NAME`` or
``sql.function(…)``), never a literal, an f-string or a concatenation; every workers.sql
statement that writes ``workers_job`` or locks it for an attempt carries the live-lease
predicate exactly as ``sql.LIVE_LEASE`` spells it; and the predicate is spelled nowhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from workers import sql

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "workers"
EXECUTING = {"execute", "executemany", "raw", "copy"}


def engine_modules() -> list[Path]:
    return sorted(p for p in WORKERS.rglob("*.py") if "migrations" not in p.parts and p != WORKERS / "sql.py")


def statement_calls(path: Path) -> list[tuple[int, ast.expr, set[str]]]:
    """(line, first argument, the enclosing function's parameters) of every call that hands SQL
    to a cursor or a manager."""
    found: list[tuple[int, ast.expr, set[str]]] = []

    def visit(node: ast.AST, params: set[str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            params = {a.arg for a in arguments}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in EXECUTING and node.args:
            found.append((node.lineno, node.args[0], params))
        for child in ast.iter_child_nodes(node):
            visit(child, params)

    visit(ast.parse(path.read_text(), filename=str(path)), set())
    return found


def from_sql_module(arg: ast.expr) -> bool:
    """``sql.NAME``, ``sql.NAME[...]`` or ``sql.function(...)``: a statement of workers.sql."""
    if isinstance(arg, ast.Subscript):
        arg = arg.value
    if isinstance(arg, ast.Call):
        arg = arg.func
    return isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "sql"


def passed_through(arg: ast.expr, params: set[str]) -> bool:
    """The enclosing function's own parameter: a helper running the statement its caller chose
    (the next test checks that every such caller chooses one from workers.sql)."""
    return isinstance(arg, ast.Name) and arg.id in params


@pytest.mark.parametrize("path", engine_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_engine_statement_comes_from_workers_sql(path: Path) -> None:
    strays = [
        f"{path.relative_to(ROOT)}:{line}: {ast.unparse(arg)[:80]}"
        for line, arg, params in statement_calls(path)
        if not (from_sql_module(arg) or passed_through(arg, params))
    ]
    assert strays == [], "hand-written SQL outside workers/sql.py:\n" + "\n".join(strays)


def test_helpers_that_take_a_statement_are_only_given_workers_sql_ones() -> None:
    """A helper that executes a parameter is itself only ever handed a workers.sql statement, or
    one a chooser picked (a function each of whose returns names a workers.sql statement first)."""
    statement_at = {"_claim": 0, "_execute": 0, "_ensure_usage": 1, "_update": 1}  # helper -> positional index
    choosers = {"_statement"}  # transitions._statement: the fenced statement of a decision
    calls, chosen, strays = 0, 0, []
    for path in engine_modules():
        tree = ast.parse(path.read_text())
        picked: set[str] = set()  # names assigned from a chooser's call: ``statement, values = _statement(…)``
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in choosers:
                for ret in (n for n in ast.walk(node) if isinstance(n, ast.Return)):
                    first = ret.value.elts[0] if isinstance(ret.value, ast.Tuple) else ret.value
                    chosen += 1
                    if first is None or not from_sql_module(first):
                        where = f"{path.relative_to(ROOT)}:{ret.lineno}"
                        strays.append(f"{where}: {node.name} returns a statement not from workers.sql")
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                callee = node.value.func
                if isinstance(callee, ast.Name) and callee.id in choosers:
                    target = node.targets[0]
                    first_target = target.elts[0] if isinstance(target, ast.Tuple) else target
                    if isinstance(first_target, ast.Name):
                        picked.add(first_target.id)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in statement_at and len(node.args) > statement_at[name]:
                calls += 1
                arg = node.args[statement_at[name]]
                if not (from_sql_module(arg) or (isinstance(arg, ast.Name) and arg.id in picked)):
                    strays.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(arg)[:80]}")
    assert calls >= 10 and chosen == 5 and strays == []


def statements() -> dict[str, str]:
    found = {n: v for n, v in vars(sql).items() if n.isupper() and not n.startswith("_") and isinstance(v, str)}
    found.update({f"COUNT_RUNNING_IN_SCOPE{key}": value for key, value in sql.COUNT_RUNNING_IN_SCOPE.items()})
    found["insert_jobs(3)"] = sql.insert_jobs(3)
    return found


def test_every_attempt_side_write_of_the_job_row_is_fenced_by_the_one_predicate() -> None:
    fenced = {"HOLD_LEASE", "HEARTBEAT", "COMPLETE", "RETRY_LATER", "FAIL", "PARK", "RELEASE", "ADD_OPERATION_USAGE"}
    for name in fenced:
        assert sql.LIVE_LEASE in statements()[name], name
    # Spelled once: no other statement re-types (a variant of) the live-lease check.
    others = {name for name, text in statements().items() if "lease_expires_at > now()" in text}
    assert others == fenced | {"LIVE_LEASE"}


def test_the_strict_fence_locks_the_row_and_names_the_token() -> None:
    assert sql.HOLD_LEASE == (
        "SELECT 1 FROM workers_job WHERE id = %(job_id)s AND lease_token = %(lease_token)s "
        "AND state IS NOT DISTINCT FROM 'running' AND lease_expires_at > now() FOR NO KEY UPDATE"
    )


def test_statements_bind_values_and_leave_no_placeholder_unfilled() -> None:
    for name, text in statements().items():
        # A leftover "{where}" means a template escaped its one composition at import.
        assert "{where}" not in text and "{fence}" not in text and "{job_set}" not in text, name
        uses_named, uses_positional = "%(" in text, "%s" in text
        assert not (uses_named and uses_positional), f"{name} mixes %s and %(name)s"


def test_the_ledger_asks_the_review_gate_through_the_hooks_registry() -> None:
    tree = ast.parse((WORKERS / "ledger.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name == "reviews" or name.startswith("reviews.") for name in imported)
