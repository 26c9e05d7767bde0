"""api/openapi.json: a valid OpenAPI document of exactly the calls docs/worker-api.md lists, whose
409 names exactly the engine's four rejections, served as is by ``GET /api/v1/openapi.json``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import schemathesis
from django.test import RequestFactory

from api.views import spec
from tests.support.doc_commands import REPO
from workers.errors import Rejection

CONTRACT = REPO / "docs" / "worker-api.md"
LEASE_CALLS = {"heartbeat", "complete", "fail", "operation_begin", "operation_settle"}


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((REPO / "api" / "openapi.json").read_text())
    return loaded


def operations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{method.upper()} {path}": op for path, item in doc["paths"].items() for method, op in item.items()}


def contract_calls() -> dict[str, str]:
    """The call table of docs/worker-api.md: 'METHOD /path' -> scope."""
    rows = re.findall(r"^\| [^|]+ \| `(GET|POST) (/api/v1/[^`]+)` \| (\w+) \|$", CONTRACT.read_text(), re.M)
    return {f"{method} {path}": scope for method, path, scope in rows}


def test_the_document_is_valid_openapi_that_schemathesis_loads() -> None:
    schema = schemathesis.openapi.from_dict(document())
    schema.validate()  # raises on a document that breaks the OpenAPI 3 meta-schema
    loaded = sorted(result.ok().label for result in schema.get_all_operations())
    assert loaded == sorted(operations(document()))


def test_a_broken_document_is_refused_by_the_same_check() -> None:
    broken = document()
    broken["paths"]["/api/v1/jobs"]["post"]["responses"]["200"]["content"] = "not a map"
    with pytest.raises(Exception, match="content"):
        schemathesis.openapi.from_dict(broken).validate()


def test_every_call_of_the_contract_is_in_the_document_and_nothing_else() -> None:
    calls = contract_calls()
    assert len(calls) == 15, calls  # the table was read: six worker calls, two operation calls, three job calls, four run calls
    assert "GET /api/v1/openapi.json" in CONTRACT.read_text()
    assert set(operations(document())) == set(calls) | {"GET /api/v1/openapi.json"}


def test_every_call_but_the_document_itself_needs_a_bearer_key() -> None:
    doc = document()
    bearer = doc["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    assert doc["security"] == [{"bearer": []}]
    for label, op in operations(doc).items():
        if label == "GET /api/v1/openapi.json":
            assert op["security"] == [] and "401" not in op["responses"]
        else:
            assert "security" not in op and "401" in op["responses"], label


def test_the_409_reasons_are_exactly_the_engines_rejections() -> None:
    doc = document()
    rejection = doc["components"]["schemas"]["Rejection"]
    assert rejection["properties"]["error"]["enum"] == [r.value for r in Rejection]
    assert rejection["required"] == ["error", "message"] and rejection["additionalProperties"] is False
    rejected = {"$ref": "#/components/responses/Rejected"}
    by_id = {op["operationId"]: op for op in operations(doc).values()}
    assert {op_id for op_id, op in by_id.items() if op["responses"].get("409") == rejected} == LEASE_CALLS


def test_the_contracts_bounds_are_in_the_request_schemas() -> None:
    schemas = document()["components"]["schemas"]
    register = schemas["RegisterRequest"]["properties"]
    assert (register["concurrency"]["minimum"], register["concurrency"]["maximum"]) == (1, 256)
    assert register["name"]["pattern"] == "^[A-Za-z0-9._@+-]{1,200}$"
    assert schemas["AcquireRequest"]["properties"]["max"]["minimum"] == 1
    assert schemas["CompleteRequest"]["properties"]["spans"]["maxItems"] == 1000
    classes = re.findall(r"^\| `(\w+)` \| ", CONTRACT.read_text().split("`classification` is one of:")[1].split("##")[0], re.M)
    assert schemas["FailRequest"]["properties"]["classification"]["enum"] == classes


def test_the_view_serves_the_checked_in_document() -> None:
    answer = spec.openapi(RequestFactory().get("/api/v1/openapi.json"))
    assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
    assert json.loads(answer.content) == document()


def test_the_view_answers_another_method_with_a_json_405() -> None:
    answer = spec.openapi(RequestFactory().post("/api/v1/openapi.json", data=b"{}", content_type="application/json"))
    assert answer.status_code == 405 and answer["Allow"] == "GET, HEAD"
    assert json.loads(answer.content)["error"] == "method_not_allowed"


def test_any_other_api_path_answers_the_documents_json_404() -> None:
    answer = spec.not_found(RequestFactory().post("/api/v1/leases/-1/heartbeat"), "leases/-1/heartbeat")
    assert answer.status_code == 404 and answer["Content-Type"] == "application/json"
    assert json.loads(answer.content) == {
        "error": "not_found",
        "message": "no API call at '/api/v1/leases/-1/heartbeat'; see /api/v1/openapi.json",
    }
