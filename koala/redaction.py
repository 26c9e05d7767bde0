"""Redaction: one module for failure records, ledger rows, logs, Sentry events, pages and commands.

Nothing sensitive should be stored or sent in the first place, so every error message, input
summary, log record and Sentry event goes through here before it leaves the process. Four
mechanisms (the contract for kind authors is in docs/redaction.md):

- **keys**: values under a declared sensitive field (per job kind) or an always-sensitive key
  (``ALWAYS_SENSITIVE_KEYS``) are replaced by ``MASK`` in structured data;
- **known values**: the values under those keys, wherever they turn up in free text or under
  another key: literally (values of at least ``MIN_LITERAL`` characters, also JSON- and
  URL-escaped), and for values of at least ``FRAGMENT_WINDOW`` characters every fragment of
  ``FRAGMENT_WINDOW`` or more of their characters (a prompt's first 100 characters, an excerpt);
- **patterns**: credential-shaped strings (bearer tokens, API keys, AWS keys, JWTs, passwords in
  URLs, Luhn-valid card numbers), also when URL-encoded.
- **configured secrets**: the process's own (``configured_secrets``: the signing key, the
  provider keys, the database and SMTP passwords...), in every text whatever the context.

The known values live in a ``Redactor``, one per attempt and one per request: the worker runtime
binds the attempt's (``bind``) around the body and everything it reports; the web middleware
binds the request's, and a page about a job joins the job's to it (``extend``). ``redact_text``,
``redact_data``, the logging filter and the Sentry hooks all use the bound one, so every sink
masks what the current attempt or request knows to be secret.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import functools
import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote_plus, urlencode, urlsplit, urlunsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

MASK = "[redacted]"
MAX_MESSAGE_CHARS = 500
MAX_DATA_CHARS = 10_000
# A known value shorter than this is not masked in free text (it would mask ordinary words);
# under its own key it is masked whatever its length.
MIN_LITERAL = 4
# Fragments: every window of this many characters of a known value at least this long is masked
# wherever it appears, so any excerpt of FRAGMENT_WINDOW characters or more is caught; shorter
# excerpts are not distinctive enough to tell from ordinary text.
FRAGMENT_WINDOW = 20
# A window with fewer distinct characters ("--------------------", a run of spaces or zeros)
# says nothing about the value it came from: it is not used, so it masks nothing else.
MIN_DISTINCT = 8

# Keys whose values are never kept, whatever the job kind declares. Compared lower-case with
# "-" read as "_", so HTTP header names (X-Api-Key) match too.
ALWAYS_SENSITIVE_KEYS = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "bearer",
        "access_token",
        "refresh_token",
        "id_token",
        "auth_token",
        "api_key",
        "apikey",
        "x_api_key",
        "x_auth_token",
        "authorization",
        "proxy_authorization",
        "cookie",
        "set_cookie",
        "session",
        "sessionid",
        "csrftoken",
        "csrfmiddlewaretoken",
        "jwt",
        "client_secret",
        "secret_key",
        "aws_secret_access_key",
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
    digits = re.sub(r"%20|[^0-9]", "", match.group(0))
    return MASK if 13 <= len(digits) <= 19 and _luhn_ok(digits) else match.group(0)


# Card digits may be grouped by spaces, dashes, "+" or "%20" (a URL-encoded space).
_CARD_SEPARATOR = r"(?:[ +-]|%20)?"

_PATTERNS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    # Payment-card-like numbers (13-19 digits, optionally grouped).
    (re.compile(rf"\b\d(?:{_CARD_SEPARATOR}\d){{12,18}}\b"), _mask_card),
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
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"), MASK),
    # Credentials embedded in URLs: scheme://[user]:password@host. The user name is optional
    # (redis://:pw@cache) and may be an address; the password runs to the LAST "@" before the
    # host (a raw "@" or ":" in it is masked too). A "/" ends the authority, as in every URL
    # parser, and a quote, "<", ">", "\" or whitespace ends the URL itself (JSON, HTML, a repr).
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/\"<>\\]*:)[^\s/\"<>\\]+@"), r"\1" + MASK + "@"),
]


def _extra_patterns() -> list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]]:
    from django.conf import settings

    extra = getattr(settings, "KOALA_REDACT_EXTRA_PATTERNS", [])
    return [(re.compile(p), MASK) for p in extra]


# The process's own secrets, from its settings (each read from NAME or NAME_FILE): masked in every
# text whatever the context, so a body or a library that prints the signing key, a provider key
# or the database or SMTP password carries none of them into a failure record, a log line, a page or a
# Sentry event. Shorter values are not masked in free text: they would mask ordinary words (an
# unset key is "").
CONFIGURED_SECRET_SETTINGS = (
    "SECRET_KEY",
    "KOALA_PAYMENTS_API_KEY",
    "KOALA_MODELS_API_KEY",
    "SENTRY_DSN",
    "KOALA_METRICS_TOKEN",
    "KOALA_REDIS_PASSWORD",
    "KOALA_REDIS_SENTINEL_PASSWORD",
)
MIN_CONFIGURED_SECRET = 10


def configured_secrets() -> tuple[str, ...]:
    """The configured secrets as they may be written (``_variants``), longest first."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        found = [getattr(settings, name, "") for name in CONFIGURED_SECRET_SETTINGS]
        found.append(settings.DATABASES.get("default", {}).get("PASSWORD") or "")
        # EMAIL_HOST_PASSWORD: the SMTP mailer's options (koala/settings.py MAILERS).
        found.append((getattr(settings, "MAILERS", {}).get("default", {}).get("OPTIONS") or {}).get("password") or "")
        found.extend((getattr(settings, "KOALA_OTLP_HEADERS", None) or {}).values())
    except ImproperlyConfigured:  # outside a configured Django: nothing is known
        return ()
    return _configured_literals(tuple(v for v in found if isinstance(v, str) and len(v) >= MIN_CONFIGURED_SECRET))


@functools.lru_cache(maxsize=8)
def _configured_literals(values: tuple[str, ...]) -> tuple[str, ...]:
    written = {variant for value in values for variant in _variants(value) if len(variant) >= MIN_CONFIGURED_SECRET}
    return tuple(sorted(written, key=lambda v: (-len(v), v)))


def _norm_key(key: str) -> str:
    return key.lower().replace("-", "_")


def _variants(value: str) -> set[str]:
    """The value as it is written in text, in JSON, in a URL or form (both encodings)."""
    return {value, json.dumps(value)[1:-1], quote_plus(value), quote(value, safe="")}


@dataclass(frozen=True, eq=False)
class Redactor:
    """What one attempt or one request knows to be secret: declared sensitive field names and
    the values found under them (or under an always-sensitive key). Immutable; ``merged`` and
    ``learn`` return a new one. Build a job's with ``workers.kinds.job_redactor(job)``."""

    sensitive: frozenset[str] = frozenset()
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sensitive", frozenset(_norm_key(k) for k in self.sensitive))
        kept = {v for v in self.values if isinstance(v, str) and len(v) >= MIN_LITERAL}
        object.__setattr__(self, "values", tuple(sorted(kept, key=lambda v: (-len(v), v))))

    @classmethod
    def of(cls, data: Any = None, *, sensitive: Iterable[str] = (), values: Iterable[str] = ()) -> Redactor:
        """The context for ``data`` (a job's input): ``sensitive`` names its declared fields."""
        declared = frozenset(sensitive)
        return cls(declared, (*values, *sensitive_values(data, sensitive=declared)))

    @classmethod
    def for_request(cls, request: HttpRequest) -> Redactor:
        """A request's context: the values it carries under sensitive names (query parameters,
        headers such as Authorization, every cookie), to mask them wherever they are repeated.
        The body is not read here (that is the view's business); Sentry's hook adds its fields."""
        found: list[str] = [str(v) for v in request.COOKIES.values()]
        for key, values in request.GET.lists():
            if is_sensitive_key(key):
                found.extend(values)
        for name, header in request.headers.items():
            if is_sensitive_key(name):
                found.extend(_credential_parts(header))
        return cls(values=tuple(found))

    def merged(self, other: Redactor) -> Redactor:
        if other is self or (other.sensitive <= self.sensitive and self._value_set.issuperset(other.values)):
            return self  # nothing new (the common case: data repeating what the context knows)
        if self.sensitive <= other.sensitive and other._value_set.issuperset(self.values):
            return other
        joined = Redactor(self.sensitive | other.sensitive, self.values + other.values)
        if "_windows" in self.__dict__ or "_windows" in other.__dict__:
            # One side is indexed already (a page joining its job's context to the request's):
            # reuse it rather than index a long prompt again (~80 ms for 20,000 characters).
            joined.__dict__["_windows"] = self._windows | other._windows
        return joined

    def learn(self, data: Any) -> Redactor:
        """This context plus the values under sensitive keys of ``data`` (an operation's params)."""
        return self.merged(Redactor.of(data, sensitive=self.sensitive))

    def is_sensitive(self, key: str) -> bool:
        normal = _norm_key(key)
        return normal in ALWAYS_SENSITIVE_KEYS or normal in self.sensitive

    # -- known values ------------------------------------------------------------------------
    @cached_property
    def _value_set(self) -> frozenset[str]:
        return frozenset(self.values)

    @cached_property
    def _literals(self) -> tuple[str, ...]:
        written = {variant for value in self.values for variant in _variants(value) if len(variant) >= MIN_LITERAL}
        return tuple(sorted(written, key=lambda v: (-len(v), v)))

    @cached_property
    def _windows(self) -> frozenset[str]:
        width = FRAGMENT_WINDOW
        return frozenset(
            window
            for value in self._literals
            if len(value) >= width
            for window in (value[i : i + width] for i in range(len(value) - width + 1))
            if len(set(window)) >= MIN_DISTINCT
        )

    def _mask_known(self, text: str) -> str:
        for value in self._literals:
            if value in text:
                text = text.replace(value, MASK)
        windows, width = self._windows, FRAGMENT_WINDOW
        if not windows or len(text) < width:
            return text
        # Spans covered by windows of a known value, merged where they touch or overlap.
        spans: list[list[int]] = []
        for start in range(len(text) - width + 1):
            if text[start : start + width] in windows:
                if spans and start <= spans[-1][1]:
                    spans[-1][1] = start + width
                else:
                    spans.append([start, start + width])
        if not spans:
            return text
        parts, at = [], 0
        for start, end in spans:
            parts += [text[at:start], MASK]
            at = end
        parts.append(text[at:])
        return "".join(parts)

    def _mask(self, text: str) -> str:
        for value in configured_secrets():
            if value in text:
                text = text.replace(value, MASK)
        text = self._mask_known(text)
        for pattern, replacement in _PATTERNS + _extra_patterns():
            text = pattern.sub(replacement, text)
        return text

    # -- the sinks' API ----------------------------------------------------------------------
    def text(self, text: str, *, limit: int | None = MAX_MESSAGE_CHARS) -> str:
        """Known values, their fragments and credential shapes masked; then bounded to ``limit``."""
        out = self._mask(text)
        if "%" in out or "+" in out:
            # URL-encoded text (a query string, a form body, an encoded URL in a message): look
            # again at its decoded form, and keep that (masked) if it hid something.
            decoded = unquote_plus(out)
            if decoded != out:
                masked = self._mask(decoded)
                if masked != decoded:
                    out = masked
        if limit is not None and len(out) > limit:
            out = out[: limit - 1] + "…"
        return out

    def data(self, value: Any, *, limit: int | None = MAX_DATA_CHARS) -> Any:
        """A copy of JSON-like data: sensitive keys masked, every string through ``text``, which
        also masks the values under ``value``'s own sensitive keys wherever else it repeats them."""
        return self.learn(value)._data(value, limit)

    def _data(self, value: Any, limit: int | None) -> Any:
        if isinstance(value, Mapping):
            return {k: MASK if self.is_sensitive(str(k)) else self._data(v, limit) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._data(v, limit) for v in value]
        if isinstance(value, str):
            return self.text(value, limit=limit)
        if isinstance(value, int | float) and not isinstance(value, bool) and self._secret_number(value):
            return MASK
        return value

    def _secret_number(self, value: float) -> bool:
        digits = str(value)
        if digits in self.values:
            return True
        return isinstance(value, int) and 13 <= len(str(abs(value))) <= 19 and _luhn_ok(str(abs(value)))

    def query(self, query: str) -> str:
        """A URL query string or form body, parameter by parameter (decoded, masked, re-encoded)."""
        try:
            pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
        except ValueError:
            return MASK
        if not pairs and query:
            return self.text(query, limit=None)
        return urlencode(
            [(self.text(k, limit=None), MASK if self.is_sensitive(k) else self.text(v, limit=None)) for k, v in pairs],
            safe="[]",
        )

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        if not parts.query:
            return self.text(url, limit=None)
        return self.text(urlunsplit(parts._replace(query=self.query(parts.query))), limit=None)

    def deep(self, value: Any) -> Any:
        """Any structure (a Sentry event or breadcrumb): sensitive keys masked, every string and
        key masked, objects other than numbers and times replaced by their masked repr."""
        if isinstance(value, str):
            return self.text(value, limit=None)
        if isinstance(value, Mapping):
            return {
                (self.text(k, limit=None) if isinstance(k, str) else k): MASK
                if isinstance(k, str) and self.is_sensitive(k)
                else self.deep(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple | set | frozenset):
            return [self.deep(v) for v in value]
        if value is None or isinstance(value, bool | dt.datetime | dt.date | dt.time | dt.timedelta):
            return value
        if isinstance(value, int | float):
            # Only a known value: ids and line numbers of an event must stay numbers.
            return MASK if str(value) in self.values else value
        try:
            shown = repr(value)
        except Exception:
            shown = f"<{type(value).__name__}>"
        return self.text(shown, limit=None)


def _credential_parts(value: str) -> list[str]:
    """A header value and, for "Scheme credentials", the credentials alone."""
    parts = value.split(None, 1)
    return [value, parts[1]] if len(parts) == 2 else [value]


EMPTY = Redactor()

_current: contextvars.ContextVar[Redactor] = contextvars.ContextVar("koala_redactor", default=EMPTY)


def current() -> Redactor:
    """The redaction context of the running attempt or request (EMPTY outside both)."""
    return _current.get()


@contextmanager
def bind(redactor: Redactor) -> Iterator[Redactor]:
    """Make ``redactor`` (joined to the one already bound) current until the block ends; any
    ``extend`` inside ends with it. A thread started inside does not inherit it."""
    joined = _current.get().merged(redactor)
    token = _current.set(joined)
    try:
        yield joined
    finally:
        _current.reset(token)


def extend(redactor: Redactor) -> None:
    """Join ``redactor`` to the current context for the rest of the enclosing ``bind`` (a page
    that learns which job it shows: its template renders after the view returns, and an error
    while rendering is reported by the request's handler, both still inside the request's bind)."""
    _current.set(_current.get().merged(redactor))


class RedactionMiddleware:
    """Binds one redaction context per request (``Redactor.for_request``), first in MIDDLEWARE so
    that logging, Sentry and pages of the whole request share it."""

    # Both modes: under the ASGI server (koala/asgi.py) a sync-only middleware would run every
    # async view, the worker API's minute-long acquire included, on a thread of its own.
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if iscoroutinefunction(self):
            return self._acall(request)
        with bind(Redactor.for_request(request)):
            return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        with bind(Redactor.for_request(request)):
            return await self.get_response(request)


# -- the module-level API: the current context plus what the caller knows ----------------------


def redact_text(text: str, *, secrets: Iterable[str] = (), limit: int = MAX_MESSAGE_CHARS) -> str:
    """Mask credential-shaped substrings, the bound context's known values (and ``secrets``,
    literal values the caller knows to be sensitive), then bound the length."""
    redactor = current()
    extra = tuple(secrets)
    if extra:
        redactor = redactor.merged(Redactor(values=extra))
    return redactor.text(text, limit=limit)


def is_sensitive_key(key: str, declared: Iterable[str] = ()) -> bool:
    normal = _norm_key(key)
    return normal in ALWAYS_SENSITIVE_KEYS or normal in {_norm_key(d) for d in declared}


def redact_data(value: Any, *, sensitive: Iterable[str] = (), secrets: Iterable[str] = ()) -> Any:
    """A copy of JSON-like data with sensitive keys masked and strings masked as ``redact_text``,
    including the values under its own sensitive keys wherever else ``value`` repeats them."""
    return current().merged(Redactor(frozenset(sensitive), tuple(secrets))).data(value)


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


@dataclass(frozen=True, eq=False)
class _LoggedException:
    """A logged exception, kept on its record for Sentry alone (``restore_logged_exception``).
    Printed, it shows nothing of the exception: a handler that dumps every attribute of a
    record must not find the raw text the filter masked."""

    exc_info: tuple[type[BaseException], BaseException, Any]

    def __repr__(self) -> str:
        return "<logged exception (masked into the message)>"

    __str__ = __repr__


LOGGED_EXCEPTION_ATTR = "_koala_exception"  # "_": never in Sentry's "extra" (the SDK skips those)


class RedactingFilter(logging.Filter):
    """Masks secrets in every log record before any handler formats it, with the context of the
    attempt or request that logs it. The record is changed in place, so every handler after
    this one (and Sentry's, which runs after all of them) gets the masked record."""

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = current()
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not drop the record
            message = str(record.msg)
        record.msg = redactor.text(message, limit=4_000)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            # The text handlers get the exception folded into the message, masked, and no
            # traceback (a handler formatting exc_info would print the raw text). Sentry's event
            # is built from the record after every handler ran: it gets the exception back from
            # the record (restore_logged_exception), and before_send masks it with this context.
            exc = record.exc_info[1]
            setattr(record, LOGGED_EXCEPTION_ATTR, _LoggedException((type(exc), exc, record.exc_info[2])))
            record.exc_text = None
            record.msg += f" [{type(exc).__name__}: {redactor.text(str(exc))}]"
            record.exc_info = None
        return True


# -- Sentry ----------------------------------------------------------------------------------


def _request_redactor(request: Mapping[str, Any]) -> Redactor:
    """What an event's request section carries under sensitive names (query, form, headers,
    cookies): masked wherever else the event repeats it (an exception message, a repr)."""
    found: list[str] = []
    query = request.get("query_string")
    if isinstance(query, str):
        found += [v for k, v in parse_qsl(query, keep_blank_values=True) if is_sensitive_key(k)]
    data = request.get("data")
    if isinstance(data, Mapping):
        found += sensitive_values(data)
    elif isinstance(data, str):
        found += [v for k, v in parse_qsl(data, keep_blank_values=True) if is_sensitive_key(k)]
    headers = request.get("headers")
    if isinstance(headers, Mapping):
        for key, value in headers.items():
            if isinstance(value, str) and is_sensitive_key(str(key)):
                found += _credential_parts(value)
    cookies = request.get("cookies")
    if isinstance(cookies, Mapping):
        found += [str(v) for v in cookies.values()]
    return Redactor(values=tuple(found))


def _scrub_request(request: dict[str, Any], redactor: Redactor) -> None:
    if isinstance(request.get("query_string"), str):
        request["query_string"] = redactor.query(request["query_string"])
    if isinstance(request.get("url"), str):
        request["url"] = redactor.url(request["url"])
    if isinstance(request.get("cookies"), Mapping):
        request["cookies"] = {name: MASK for name in request["cookies"]}
    elif "cookies" in request:
        request["cookies"] = MASK
    if isinstance(request.get("data"), str) and "=" in request["data"]:
        request["data"] = redactor.query(request["data"])


def scrub_sentry_event(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
    """Sentry ``before_send`` (and ``before_send_transaction``): with the bound context plus the
    request's own sensitive values, mask the request (query string, URL, headers, cookies, form
    data), exception values, messages and log entries, breadcrumbs, extra and everything else;
    frame locals are dropped. A failure here makes the SDK drop the event, never send it raw."""
    redactor = current()
    request = event.get("request")
    if isinstance(request, dict):
        redactor = redactor.merged(_request_redactor(request))
        _scrub_request(request, redactor)
    for exc in (event.get("exception") or {}).get("values", []) or []:
        for frame in (exc.get("stacktrace") or {}).get("frames", []) or []:
            frame.pop("vars", None)
    for thread in (event.get("threads") or {}).get("values", []) or []:
        for frame in (thread.get("stacktrace") or {}).get("frames", []) or []:
            frame.pop("vars", None)
    logentry = event.get("logentry")
    if isinstance(logentry, dict):
        logentry.pop("params", None)  # the raw arguments; "formatted" (masked) says it all
    scrubbed: dict[str, Any] = redactor.deep(event)
    return scrubbed


def restore_logged_exception(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
    """Sentry event processor (registered in koala/settings.py): an event made from a log record
    whose exception ``RedactingFilter`` folded into the message (``log.exception``, ``exc_info=``)
    gets its exception back, built by the SDK exactly as for any logged exception: the chain's
    types, messages and frames (no local variables: ``include_local_variables=False``). It runs
    before ``before_send``, which then masks it with the bound context like the rest."""
    held = getattr(hint.get("log_record"), LOGGED_EXCEPTION_ATTR, None)
    if not isinstance(held, _LoggedException) or event.get("exception"):
        return event
    import sentry_sdk
    from sentry_sdk.utils import event_from_exception

    # Never the frames' local variables, whatever the client was given (they hold inputs, lease
    # tokens, values a body fetched itself: no context knows them all).
    options = {**sentry_sdk.get_client().options, "include_local_variables": False}
    built, _ = event_from_exception(held.exc_info, client_options=options, mechanism={"type": "logging", "handled": True})
    event["exception"] = built["exception"]
    return event


def scrub_sentry_breadcrumb(crumb: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
    """Sentry ``before_breadcrumb``: a breadcrumb is recorded while its attempt or request is
    bound, and may be sent with a later event: mask it now, with the context that knows."""
    redactor = current()
    data = crumb.get("data")
    if isinstance(data, dict):
        for key in ("url", "http.query"):
            if isinstance(data.get(key), str):
                data[key] = redactor.url(data[key]) if key == "url" else redactor.query(data[key])
    scrubbed: dict[str, Any] = redactor.deep(crumb)
    return scrubbed
