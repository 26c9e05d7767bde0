"""``GET /api/v1/openapi.json``: the checked-in OpenAPI document of the worker protocol (no key needed)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from api.http import ApiError

DOCUMENT = Path(__file__).resolve().parents[1] / "openapi.json"


@cache
def document() -> dict[str, Any]:
    """The parsed document, read once per process (the file only changes with a deploy)."""
    loaded: dict[str, Any] = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    return loaded


@csrf_exempt  # no cookie, no session: another method is answered 405 as JSON, not with the CSRF page
def openapi(request: HttpRequest) -> JsonResponse:
    if request.method not in ("GET", "HEAD"):
        return ApiError(
            405, "method_not_allowed", f"{request.method} is not allowed here; use GET", headers={"Allow": "GET, HEAD"}
        ).response()
    return JsonResponse(document())


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any other path under /api/v1/ (a lease id that is not a number, a worker id with a slash):
    the document's JSON error, not Django's HTML page (a worker parses every answer as JSON)."""
    return ApiError(404, "not_found", f"no API call at {request.path[:200]!r}; see /api/v1/openapi.json").response()
