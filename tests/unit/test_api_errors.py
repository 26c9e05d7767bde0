"""One error table: every error the API's code can answer, docs/worker-api.md's table of them and
api/openapi.json say the same thing (no database: the code is read, not run).

The code's errors are every ``ApiError(status, "code", …)`` in api/ (``http.invalid`` is ``400
invalid_request``, ``rejected(reason)`` one of the four 409s), read from its syntax tree, so an
error added to the code without its row, or a row left for an error the code no longer answers,
fails here. The document's ``Error`` schema names exactly the non-409 codes, its ``Rejection``
schema the four reasons, and every status the code answers is declared by the operations that
can answer it (worker calls, job calls).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from tests.support.doc_commands import REPO
from workers.errors import Rejection

API = REPO / "api"
CONTRACT = REPO / "docs" / "worker-api.md"


def code_errors() -> set[tuple[int, str]]:
    """(status, code) of every error api/ can answer."""
    found: set[tuple[int, str]] = set()
    for path in sorted(API.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "invalid":
                found.add((400, "invalid_request"))
            elif name == "rejected":
                found.update((409, reason.value) for reason in Rejection)
            elif name == "ApiError" and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant):
                status, code = node.args[0].value, node.args[1]
                if isinstance(code, ast.Constant):
                    found.add((int(status), str(code.value)))
                elif isinstance(code, ast.Attribute) and isinstance(code.value, ast.Attribute) and code.attr == "value":
                    found.add((int(status), Rejection[code.value.attr].value))  # Rejection.NAME.value
                elif status == 409:
                    found.update((409, reason.value) for reason in Rejection)  # rejected(): one of the four, by name
                else:
                    raise AssertionError(f"{path}:{node.lineno}: an ApiError whose code is not a literal: {ast.unparse(code)}")
    return found


def table_errors() -> dict[tuple[int, str], str]:
    """docs/worker-api.md's error table: (status, code) -> which calls answer it."""
    section = CONTRACT.read_text().split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d{3})` \| `([a-z_]+)` \| ([^|]+) \| [^|]+ \|$", section, re.M)
    return {(int(status), code): calls.strip() for status, code, calls in rows}


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((API / "openapi.json").read_text())
    return loaded


def test_the_table_lists_exactly_the_errors_the_code_answers() -> None:
    code, table = code_errors(), set(table_errors())
    assert len(code) >= 20, sorted(code)  # the scan found the API's errors
    assert sorted(code - table) == [], "answered by the code, missing from docs/worker-api.md's error table"
    assert sorted(table - code) == [], "in docs/worker-api.md's error table, answered by no code"


def test_the_document_names_the_same_codes() -> None:
    doc = document()
    codes = {code for status, code in code_errors() if status != 409}
    assert set(doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]) == codes
    reasons = {code for status, code in code_errors() if status == 409}
    rejections = set(doc["components"]["schemas"]["Rejection"]["properties"]["error"]["enum"])
    assert rejections == reasons == {r.value for r in Rejection}


def test_every_status_is_declared_by_the_calls_the_table_says_answer_it() -> None:
    doc = document()
    operations = {
        (method.upper(), path): set(op["responses"]) for path, item in doc["paths"].items() for method, op in item.items()
    }
    groups = {
        "worker calls": {key for key in operations if key[1].startswith(("/api/v1/workers/", "/api/v1/leases/"))},
        "lease calls": {key for key in operations if key[1].startswith("/api/v1/leases/")},
        "job calls": {key for key in operations if key[1].startswith("/api/v1/jobs")},
        "run calls": {key for key in operations if key[1].startswith("/api/v1/runs")},
        "every call": {key for key in operations if key[1] != "/api/v1/openapi.json"},
    }
    missing = []
    for (status, code), calls in table_errors().items():
        for call in (c.strip() for c in calls.split(",")):
            if call in groups:
                targets = groups[call]
            else:  # one call, named as the document names it: "POST /api/v1/workers/register"
                method, _, path = call.partition(" ")
                targets = {(method, path.strip("`"))}
                assert targets <= set(operations), f"{status} {code}: no operation {call!r} in api/openapi.json"
            missing += [f"{status} {code}: {m} {p}" for m, p in sorted(targets) if str(status) not in operations[(m, p)]]
    assert missing == [], "statuses the table says these calls answer, not declared in api/openapi.json"


def test_a_planted_error_is_found_missing() -> None:
    """The scan reads what it must: an error the table lacks is reported."""
    source = 'raise ApiError(418, "teapot", "no coffee")'
    planted = {
        (int(node.args[0].value), node.args[1].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.args[0], ast.Constant)
    }
    assert planted - set(table_errors()) == {(418, "teapot")}
