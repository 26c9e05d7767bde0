"""Strict environment parsing.

Every setting comes from the environment (optionally via a ``NAME_FILE`` path
holding the value, as systemd credentials and Docker secrets provide). A value
that does not parse stops start-up with a message naming the variable: a typo
in ``KOALA_LEASE_SECONDS`` must never silently become the default, and neither
may ``nan`` or ``inf``: every comparison with NaN is false, so a NaN lease would pass
any minimum and then never expire (``float()`` accepts both, so they are refused here).
"""

from __future__ import annotations

import math
import os
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")


class ConfigError(ImproperlyConfigured):
    """A setting is missing or malformed; the message names the variable."""


def raw(name: str, default: str | None = None) -> str | None:
    """The value of NAME, or the contents of the file named by NAME_FILE.

    Setting both is ambiguous and refused rather than guessed at.
    """
    file_var = f"{name}_FILE"
    direct = os.environ.get(name)
    path = os.environ.get(file_var)
    if direct is not None and path is not None:
        raise ConfigError(f"{name} and {file_var} are both set; set only one.")
    if path is not None:
        try:
            # Secrets files conventionally end with a newline that is not part of the value.
            return Path(path).read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{file_var}={path!r} cannot be read: {exc.strerror}") from None
    return direct if direct is not None else default


def _parsed[T](name: str, default: T, parse: Callable[[str], T], expected: str) -> T:
    value = raw(name)
    if value is None or value == "":
        return default
    try:
        return parse(value.strip())
    except (ValueError, TypeError):
        raise ConfigError(f"{name}={value!r} is not {expected}.") from None


def string(name: str, default: str = "") -> str:
    value = raw(name)
    return default if value is None else value


def boolean(name: str, default: bool = False) -> bool:
    def parse(value: str) -> bool:
        lowered = value.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise ValueError(value)

    return _parsed(name, default, parse, "a boolean (true/false, 1/0, yes/no, on/off)")


def integer(name: str, default: int, *, minimum: int | None = None) -> int:
    result = _parsed(name, default, int, "an integer")
    if minimum is not None and result < minimum:
        raise ConfigError(f"{name}={result} must be at least {minimum}.")
    return result


def number(name: str, default: float, *, minimum: float | None = None) -> float:
    result = _parsed(name, default, float, "a number")
    if not math.isfinite(result):
        raise ConfigError(f"{name}={raw(name)!r} is not a finite number.")
    if minimum is not None and result < minimum:
        raise ConfigError(f"{name}={result} must be at least {minimum}.")
    return result


def choice(name: str, default: str, choices: list[str]) -> str:
    """One of ``choices`` (case-insensitive; surrounding spaces ignored)."""
    value = raw(name)
    if value is None or value.strip() == "":
        return default
    lowered = value.strip().lower()
    if lowered not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}.")
    return lowered


def string_list(name: str, default: list[str]) -> list[str]:
    value = raw(name)
    if value is None or value.strip() == "":
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def host_ports(name: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (an IPv6 host in brackets: ``[::1]:26379``); every item needs both.

    Empty or unset is an empty list. A port must be 1-65535; a duplicate is refused (it would
    count one server twice, as Redis Sentinel's quorum must not)."""
    value = raw(name)
    found: list[tuple[str, int]] = []
    if value is None or value.strip() == "":
        return found
    for index, item in enumerate(value.split(","), start=1):
        text = item.strip()
        host, colon, port = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or any(c in host for c in " /@[]"):
            raise ConfigError(f"{name}: item {index} ({text!r}) is not host:port with a port 1-65535.")
        if (host, int(port)) in found:
            raise ConfigError(f"{name}: item {index} ({text!r}) is listed twice.")
        found.append((host, int(port)))
    return found


HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}")


def headers(name: str) -> dict[str, str]:
    """HTTP headers as ``name=value,name2=value2`` (OpenTelemetry's OTEL_EXPORTER_OTLP_HEADERS
    form; values may be %-encoded). Values are secrets: an error names the item, never its value."""
    value = raw(name)
    found: dict[str, str] = {}
    if value is None or value.strip() == "":
        return found
    for index, item in enumerate(value.split(","), start=1):
        if not item.strip():
            continue
        key, equals, text = item.partition("=")
        key = key.strip()
        if not equals or not HEADER_NAME.fullmatch(key):
            raise ConfigError(f"{name}: item {index} must be NAME=VALUE with NAME an HTTP header name.")
        decoded = urllib.parse.unquote(text.strip())
        if not decoded or any(c in decoded for c in "\r\n\0"):
            raise ConfigError(f"{name}: the value of {key} must be non-empty and on one line.")
        found[key] = decoded
    return found
