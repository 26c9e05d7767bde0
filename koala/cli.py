"""Argument types for Koala's management commands: every value is checked while argv is parsed.

Each function returns an argparse ``type=`` callable. A bad value stops the command before
its ``handle()`` runs, so before its first side effect, with argparse's one line naming the
argument (``manage.py koala_jobs: error: argument --limit: must be a whole number from 1 to
10000, not '-1'``), exit status 2 and no traceback. The rules (docs/commands.md):

- numbers are whole or finite (no ``nan``/``inf``) and within stated bounds, which for a value
  stored in a column are the column's (``field_int``: an ``IntegerField`` holds 32 bits);
- text contains no NUL and no lone surrogate (argv bytes that are not UTF-8; see
  ``koala.storable``), is not empty unless allowed, and fits its column (``field_text`` reads
  ``max_length`` from the model);
- JSON is one object of storable strings and finite numbers;
- names (queues, kinds) are checked by the commands' own types in
  ``workers/management/commands/_common.py``, which use the services' rule (``workers.targets``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import re
import zoneinfo
from collections.abc import Callable
from datetime import date
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from koala.storable import column_length, column_range, json_problem, text_problem

Parse = Callable[[str], Any]


def shown(value: str, limit: int = 40) -> str:
    """A value as a message may quote it: short, and printable whatever it holds."""
    return repr(value) if len(value) <= limit else repr(value[: limit - 3]) + "…"


def _named(parse: Parse, name: str) -> Parse:
    parse.__name__ = name  # argparse names the type in some messages ("invalid <name> value")
    return parse


def bounded_int(minimum: int, maximum: int) -> Parse:
    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum} to {maximum}, not {shown(text)}")
        return value

    return _named(parse, "whole number")


def field_int(model: type[models.Model], field: str, *, minimum: int | None = None, maximum: int | None = None) -> Parse:
    """A whole number the column ``model.field`` can hold, narrowed by ``minimum``/``maximum``."""
    low, high = column_range(model, field)
    return bounded_int(max(low, minimum) if minimum is not None else low, min(high, maximum) if maximum is not None else high)


def _plain(number: float) -> str:
    """1e12 as 1000000000000, 0.05 as 0.05: the way a person would type the bound."""
    return f"{number:f}".rstrip("0").rstrip(".")


def finite_float(minimum: float, maximum: float, *, above_minimum: bool = False) -> Parse:
    """A finite number in [minimum, maximum] (or (minimum, maximum] with ``above_minimum``)."""
    low = f"above {_plain(minimum)} and at most" if above_minimum else f"from {_plain(minimum)} to"
    bounds = f"{low} {_plain(maximum)}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        too_low = value <= minimum if above_minimum else value < minimum
        if not math.isfinite(value) or too_low or value > maximum:
            raise argparse.ArgumentTypeError(f"must be a finite number {bounds}, not {shown(text)}")
        return value

    return _named(parse, "number")


def text(max_length: int, *, allow_empty: bool = False) -> Parse:
    def parse(value: str) -> str:
        problem = text_problem(value)
        if problem:  # not quoted: a value with a surrogate cannot even be printed as UTF-8
            raise argparse.ArgumentTypeError(problem)
        if not allow_empty and not value.strip():
            raise argparse.ArgumentTypeError("cannot be empty")
        if len(value) > max_length:
            raise argparse.ArgumentTypeError(f"is {len(value)} characters long; at most {max_length} fit")
        return value

    return _named(parse, "text")


def field_text(model: type[models.Model], field: str, *, allow_empty: bool = False) -> Parse:
    """Text that fits the column ``model.field`` (its ``max_length``)."""
    return text(column_length(model, field), allow_empty=allow_empty)


def username(model: type[models.Model]) -> Parse:
    """A name the user model accepts: its column's length and its own validators."""
    name = getattr(model, "USERNAME_FIELD", "username")
    validators = getattr(model._meta.get_field(name), "validators", [])
    fits = field_text(model, name)

    def parse(value: str) -> str:
        value = fits(value)
        try:
            for validator in validators:
                validator(value)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(f"{shown(value)} is not a valid user name: {' '.join(exc.messages)}") from None
        return value

    return _named(parse, "user name")


def json_object(max_length: int) -> Parse:
    """One JSON object whose strings PostgreSQL can store and whose numbers are finite."""

    def refuse_constant(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    def finite(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise ValueError(f"{token} is beyond what a number can hold")
        return value

    def parse(value: str) -> dict[str, Any]:
        value = text(max_length)(value)
        try:
            loaded = json.loads(value, parse_constant=refuse_constant, parse_float=finite)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"is not valid JSON: {exc.msg} at position {exc.pos}") from None
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"is not valid JSON: {exc}") from None
        except RecursionError:
            raise argparse.ArgumentTypeError("is nested too deeply") from None
        if not isinstance(loaded, dict):
            raise argparse.ArgumentTypeError('must be a JSON object, e.g. \'{"key": "value"}\'')
        problem = json_problem(loaded)
        if problem:
            raise argparse.ArgumentTypeError(f"cannot be stored: {problem}")
        return loaded

    return _named(parse, "JSON object")


def iso_date(value: str) -> date:
    try:
        return date.fromisoformat(text(10)(value))
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"{shown(value)} is not a date (YYYY-MM-DD)") from None


def time_zone(value: str) -> str:
    value = text(64)(value)
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise argparse.ArgumentTypeError(f"unknown time zone {shown(value)} (use an IANA name such as Europe/Paris)") from None
    return value


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")


def host(value: str) -> str:
    """An IP address or a DNS host name (whether it can be bound is for the command to try)."""
    value = text(253)(value)
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    # All-numeric labels (999.1.1.1) are a mistyped address, never a host name (RFC 1123 2.1).
    if all(_HOST_LABEL.match(label) for label in labels) and not all(label.isdigit() for label in labels):
        return value
    raise argparse.ArgumentTypeError(f"{shown(value)} is not an IP address or host name")


port = _named(bounded_int(1, 65535), "port")
