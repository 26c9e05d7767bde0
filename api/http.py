"""The API's HTTP edge: JSON bodies in, JSON errors out. Views parse with these and call services.

Every refusal is an ``ApiError``: a status, a stable code and one line of text, answered as
``{"error": code, "message": text}``. Nothing here touches the database; a refusal's code is
told to the rejection counters (``workers.hooks.count_rejection``, as ``api_<code>``), which
batch it (the metrics app).
"""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from workers import hooks

# The attribute a plain view carries when api/asgi.py may run it in the hub's thread pool
# (api.views.runs.execute_call sets it on every job and run call).
POOLED = "koala_api_pooled"


class ApiError(Exception):
    """A refused call: ``status`` and ``code`` for the worker, ``message`` for the person reading it."""

    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        # A client's refusal is counted by its code; a lease rejection (409 lease_expired, …) was
        # counted by name where the engine decided it, and a server error is no refusal.
        if 400 <= self.status < 500 and self.status != 409:
            hooks.count_rejection(f"api_{self.code}")
        answer = JsonResponse({"error": self.code, "message": self.message}, status=self.status)
        for name, value in self.headers.items():
            answer[name] = value
        return answer


def invalid(field: str, why: str) -> ApiError:
    return ApiError(400, "invalid_request", f"{field}: {why}")


def unavailable() -> ApiError:
    """503 with Retry-After: the database is away (a restart, a failover); the caller backs off."""
    return ApiError(503, "unavailable", "the database is unavailable; try again", headers={"Retry-After": "1"})


def busy(what: str, *, retry_after: int = 1) -> ApiError:
    """503 with Retry-After: this server process holds as much as its bounds allow (``what``);
    the caller tries again later, or another server process behind the same address."""
    return ApiError(503, "busy", f"this server is busy: {what}; try again", headers={"Retry-After": str(retry_after)})


def max_body_bytes() -> int:
    return int(getattr(settings, "KOALA_API_MAX_BODY_BYTES", 1024 * 1024))


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large to store")
    return value


def _check_text(value: Any, where: str) -> None:
    """NUL and lone surrogates cannot be stored in PostgreSQL text or jsonb: refuse them here."""
    if isinstance(value, str):
        if "\x00" in value:
            raise invalid(where, "text must not contain NUL (\\u0000)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(where, "text must be valid Unicode (a lone surrogate)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_text(item, f"{where}[{index}]")


def json_body(request: HttpRequest, *, body: bytes | None = None) -> dict[str, Any]:
    """The request's JSON object, or an ApiError (413 too large, 400 not a storable JSON object)."""
    raw = request.body if body is None else body
    if len(raw) > max_body_bytes():
        raise ApiError(413, "too_large", f"the body is {len(raw)} bytes; at most {max_body_bytes()} are accepted")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite)
    except UnicodeDecodeError:
        raise invalid("body", "not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise invalid("body", f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise invalid("body", "must be a JSON object")
    _check_text(value, "body")
    return value


# -- fields ------------------------------------------------------------------------------------


def text(data: dict[str, Any], name: str, *, required: bool = True, max_length: int = 200, default: str = "") -> str:
    value = data.get(name)
    if value is None:
        if required:
            raise invalid(name, "is required")
        return default
    if not isinstance(value, str):
        raise invalid(name, f"must be a string, not {type(value).__name__}")
    if required and not value:
        raise invalid(name, "must not be empty")
    if len(value) > max_length:
        raise invalid(name, f"is longer than {max_length} characters")
    return value


def integer(data: dict[str, Any], name: str, *, minimum: int, maximum: int, default: int | None = None) -> int:
    value = data.get(name)
    if value is None:
        if default is None:
            raise invalid(name, "is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(name, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise invalid(name, f"must be between {minimum} and {maximum}")
    return value


def number(data: dict[str, Any], name: str, *, minimum: float, maximum: float, default: float | None = None) -> float | None:
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid(name, f"must be a number, not {type(value).__name__}")
    if not minimum <= float(value) <= maximum:
        raise invalid(name, f"must be between {minimum:g} and {maximum:g}")
    return float(value)


def obj(data: dict[str, Any], name: str, *, required: bool = False) -> dict[str, Any] | None:
    value = data.get(name)
    if value is None:
        if required:
            raise invalid(name, "is required")
        return None
    if not isinstance(value, dict):
        raise invalid(name, f"must be an object, not {type(value).__name__}")
    return value


def boolean(data: dict[str, Any], name: str, *, default: bool = False) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(name, f"must be true or false, not {type(value).__name__}")
    return value
