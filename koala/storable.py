"""What PostgreSQL can store, checked before it is asked to.

PostgreSQL's text and jsonb refuse three things Python strings and floats can hold:

- the NUL character (``\\x00``; in JSON ``\\u0000``): text and jsonb cannot contain it;
- a lone surrogate (``\\udcff``): not valid UTF-8. Python hands over argv and environment
  bytes that are not UTF-8 as exactly such surrogates (PEP 383), and ``json.loads`` makes one
  of ``"\\ud800"``; psycopg cannot even encode them;
- a non-finite number (``NaN``, ``Infinity``) inside JSON: not JSON, and jsonb refuses it;
- an integer beyond its column (``column_range``: 32 bits for an IntegerField, 64 for a BigIntegerField).

Each check returns a short description of the first problem (for a message naming the
argument or field), or None when the value can be stored.
"""

from __future__ import annotations

import math
from typing import Any

from django.db import connection, models


def text_problem(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def json_problem(value: Any, *, path: str = "$") -> str | None:
    """The first unstorable string, key or number inside ``value``, as "<path> <problem>"."""
    pending: list[tuple[str, Any]] = [(path, value)]
    while pending:  # iterative: a deeply nested value must not exhaust the stack here
        where, item = pending.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return f"{where} {problem}"
        elif isinstance(item, float) and not math.isfinite(item):
            return f"{where} is not a finite number"
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and (problem := text_problem(key)):
                    return f"{where} has a key that {problem}"
                pending.append((f"{where}.{key}", child))
        elif isinstance(item, list | tuple):
            pending.extend((f"{where}[{index}]", child) for index, child in enumerate(item))
    return None


def written_out(value: Any) -> Any:
    """A copy of JSON-like ``value`` that PostgreSQL can store: a non-finite number becomes its name
    (``"NaN"``, ``"Infinity"``), a NUL or a lone surrogate becomes U+FFFD. For what came from the
    outside world and must be kept even so (a provider's answer to a call that has happened)."""
    if isinstance(value, str):
        if text_problem(value) is None:
            return value
        return "".join("\ufffd" if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {written_out(key) if isinstance(key, str) else key: written_out(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [written_out(child) for child in value]
    return value


def column_length(model: type[models.Model], field: str) -> int:
    """The characters the text column ``model.field`` holds (its ``max_length``)."""
    length = getattr(model._meta.get_field(field), "max_length", None)
    if not isinstance(length, int):
        raise TypeError(f"{model.__name__}.{field} has no max_length")
    return length


def column_range(model: type[models.Model], field: str) -> tuple[int, int]:
    """The values the integer column ``model.field`` holds, as the database backend states them."""
    low, high = connection.ops.integer_field_range(model._meta.get_field(field).get_internal_type())
    return int(low if low is not None else -(2**63)), int(high if high is not None else 2**63 - 1)
