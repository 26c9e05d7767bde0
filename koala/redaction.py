"""Redaction at write time: one module for failure records, logs and Sentry events.

Nothing sensitive should be stored in the first place, so every error message and
input summary goes through here before it reaches the database, a log line or Sentry.
Two mechanisms: declared sensitive fields (by key name, per job kind plus a global
list) and pattern masking for secrets that turn up inside free text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MASK = "[redacted]"
MAX_MESSAGE_CHARS = 500

# Keys whose values are never kept, whatever the job kind declares.
ALWAYS_SENSITIVE_KEYS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "bearer",
        "access_token",
        "refresh_token",
        "api_key",
        "apikey",
        "authorization",
        "cookie",
        "session",
        "private_key",
        "card_number",
        "cvv",
        "prompt",
        "document",
    }
)


def _luhn_ok(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        number = int(char)
        if index % 2 == 1:
            number = number * 2 - 9 if number > 4 else number * 2
        total += number
    return total % 10 == 0


def _mask_card(match: re.Match[str]) -> str:
    # Only runs that pass the Luhn check: order numbers and epoch milliseconds mostly do not.
    digits = re.sub(r"[ -]", "", match.group(0))
    return MASK if 13 <= len(digits) <= 19 and _luhn_ok(digits) else match.group(0)


_PATTERNS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    # Payment-card-like numbers (13-19 digits, optionally grouped by spaces or dashes).
    (re.compile(r"\b\d(?:[ -]?\d){12,18}\b"), _mask_card),
    # "Authorization: Bearer abc.def" and bare "Bearer abc"
    (re.compile(r"(?i)\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + MASK),
    # key=value / key: value pairs whose key names a secret
    (
        re.compile(
            r"(?i)\b((?:api[_-]?key|secret|password|passwd|token|access[_-]?token|private[_-]?key|"
            r"client[_-]?secret|authorization)\b\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
        ),
        r"\1" + MASK,
    ),
    # Well-known credential shapes: Stripe/OpenAI-style keys, AWS access keys, GitHub tokens, JWTs.
    (re.compile(r"\b(?:sk|pk|rk|tok)_(?:live|test)_[A-Za-z0-9]{8,}\b"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}\b"), MASK),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), MASK),
    # Credentials embedded in URLs: scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+@"), r"\1" + MASK + "@"),
]


def _extra_patterns() -> list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]]:
    from django.conf import settings

    extra = getattr(settings, "KOALA_REDACT_EXTRA_PATTERNS", [])
    return [(re.compile(p), MASK) for p in extra]


def redact_text(text: str, *, secrets: Iterable[str] = (), limit: int = MAX_MESSAGE_CHARS) -> str:
    """Mask credential-shaped substrings and any known secret values, then bound the length.

    ``secrets`` are literal values known to be sensitive (for example the values of a
    job's declared sensitive fields), masked wherever they appear in the text.
    """
    for value in secrets:
        if isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, MASK)
    for pattern, replacement in _PATTERNS + _extra_patterns():
        text = pattern.sub(replacement, text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def is_sensitive_key(key: str, declared: Iterable[str] = ()) -> bool:
    lowered = key.lower()
    return lowered in ALWAYS_SENSITIVE_KEYS or lowered in {d.lower() for d in declared}


def redact_data(value: Any, *, sensitive: Iterable[str] = (), secrets: Iterable[str] = ()) -> Any:
    """A copy of JSON-like data with sensitive keys masked and strings pattern-masked.

    ``secrets`` are literal values (e.g. a job's sensitive inputs) masked wherever they appear.
    """
    declared = frozenset(sensitive)
    known = list(secrets)
    if isinstance(value, Mapping):
        return {
            k: (MASK if is_sensitive_key(str(k), declared) else redact_data(v, sensitive=declared, secrets=known))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_data(v, sensitive=declared, secrets=known) for v in value]
    if isinstance(value, str):
        return redact_text(value, secrets=known, limit=10_000)
    if isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) >= 13:
        return redact_text(str(value), secrets=known) if _mask_card_int(value) else value
    return value


def _mask_card_int(value: int) -> bool:
    digits = str(abs(value))
    return 13 <= len(digits) <= 19 and _luhn_ok(digits)


def sensitive_values(value: Any, *, sensitive: Iterable[str] = ()) -> list[str]:
    """The string values held under sensitive keys, to mask them if they leak into free text."""
    declared = frozenset(sensitive)
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_sensitive_key(str(k), declared):
                found.extend(_strings(v))
            else:
                found.extend(sensitive_values(v, sensitive=declared))
    elif isinstance(value, list | tuple):
        for v in value:
            found.extend(sensitive_values(v, sensitive=declared))
    return found


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return [str(value)] if value is not None else []


class RedactingFilter(logging.Filter):
    """Masks secrets in every log record before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not drop the record
            message = str(record.msg)
        record.msg = redact_text(message, limit=4_000)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # Keep the traceback shape but never a secret carried in the exception text.
            exc = record.exc_info[1]
            record.exc_text = None
            record.msg += f" [{type(exc).__name__}: {redact_text(str(exc))}]"
            record.exc_info = None
        return True


def scrub_sentry_event(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
    """Sentry before_send: redact messages, exception values, breadcrumbs and request data."""
    for exc in event.get("exception", {}).get("values", []) or []:
        if isinstance(exc.get("value"), str):
            exc["value"] = redact_text(exc["value"])
        for frame in (exc.get("stacktrace") or {}).get("frames", []) or []:
            frame.pop("vars", None)
    if isinstance(event.get("message"), str):
        event["message"] = redact_text(event["message"])
    logentry = event.get("logentry")
    if isinstance(logentry, dict):
        for key in ("message", "formatted"):
            if isinstance(logentry.get(key), str):
                logentry[key] = redact_text(logentry[key])
        logentry.pop("params", None)
    for crumb in (event.get("breadcrumbs") or {}).get("values", []) or []:
        if isinstance(crumb.get("message"), str):
            crumb["message"] = redact_text(crumb["message"])
        crumb.pop("data", None)
    request = event.get("request")
    if isinstance(request, dict):
        request.pop("cookies", None)
        request.pop("data", None)
        if isinstance(request.get("headers"), dict):
            request["headers"] = redact_data(request["headers"], sensitive=["x-api-key"])
    if "extra" in event:
        event["extra"] = redact_data(event["extra"])
    return event
