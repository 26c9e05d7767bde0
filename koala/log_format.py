"""JSON lines for log collectors: ``KOALA_LOG_FORMAT=json`` (plain text stays the default).

One JSON object per record, on one line: ``ts`` (UTC, ISO 8601 with milliseconds), ``level``,
``logger``, ``message``, then the record's own fields (what a caller passed as ``extra=``; an
attempt's outcome line carries ``job_id``, ``attempt``, ``kind``, ``queue``, ``outcome``,
``reason`` and its timings, workers.runtime). The message was masked by
``koala.redaction.RedactingFilter`` before any handler saw it; the extra fields are masked here,
with the same redaction context (the handler runs in the thread and context that logged), by
``Redactor.data``: values under sensitive keys, credential-shaped strings and the attempt's
declared values. Anything JSON cannot hold is written as its ``str``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from koala import redaction

# What every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
    redaction.LOGGED_EXCEPTION_ATTR,
    "color_message",  # uvicorn's copy of the message with ANSI colours
}


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON (see the module docstring for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if extra:
            masked = redaction.current().data(_plain(extra))
            for key, value in masked.items():
                out.setdefault(key, value)
        if record.exc_info and record.exc_info[1] is not None:
            # Only without the redacting filter (which folds the exception into the message): the
            # type alone, never the raw text or a traceback.
            out["error"] = type(record.exc_info[1]).__name__
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"), default=str)


def _plain(value: Any) -> Any:
    """``value`` as JSON-like data (the redactor walks dicts, lists and strings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
