"""koala/log_format.py: KOALA_LOG_FORMAT=json's records, one JSON object per line, masked."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from koala.log_format import JsonFormatter
from koala.redaction import MASK, RedactingFilter, Redactor, bind

TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger wired as settings.LOGGING wires the console: the redacting filter, then the formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("koala.test_log_format")
    logger.handlers, logger.propagate, logger.level = [handler], False, logging.DEBUG
    try:
        yield logger, stream
    finally:
        logger.handlers = []


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    text = stream.getvalue()
    assert text.endswith("\n") and all(line for line in text.split("\n")[:-1])
    return [json.loads(line) for line in text.splitlines()]


def test_a_record_is_one_line_with_its_time_level_logger_and_message(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("job %s done\nsecond line", 7)
    (record,) = lines(stream)
    assert record["level"] == "INFO" and record["logger"] == "koala.test_log_format"
    assert record["message"] == "job 7 done\nsecond line"  # the newline is escaped: still one line
    assert isinstance(record["ts"], str) and record["ts"].endswith("Z") and "T" in record["ts"]


def test_extra_fields_become_keys_and_anything_else_is_its_text(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("outcome", extra={"job_id": 3, "total_seconds": 0.25, "tags": ("a", "b"), "when": object, "ok": True})
    (record,) = lines(stream)
    assert record["job_id"] == 3 and record["total_seconds"] == 0.25 and record["ok"] is True
    assert record["tags"] == ["a", "b"] and record["when"] == str(object)
    assert "args" not in record and "msg" not in record and "exc_info" not in record


def test_secrets_in_the_message_and_in_extra_fields_are_masked(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.warning("provider said Authorization: Bearer %s", TOKEN, extra={"note": f"token={TOKEN}", "password": "hunter2!"})
    (record,) = lines(stream)
    assert TOKEN not in stream.getvalue() and "hunter2!" not in stream.getvalue()
    assert MASK in record["message"] and MASK in str(record["note"]) and record["password"] == MASK


def test_an_attempts_declared_values_are_masked_in_its_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    with bind(Redactor.of({"card": "4111-2222-3333-4444"}, sensitive=frozenset({"card"}))):
        logger.info("charge failed for 4111-2222-3333-4444", extra={"error": "declined: 4111-2222-3333-4444"})
    (record,) = lines(stream)
    assert "4111-2222-3333-4444" not in stream.getvalue()
    assert record["error"] == f"declined: {MASK}"


def test_a_logged_exception_is_folded_into_the_masked_message(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    try:
        raise ValueError(f"bad key {TOKEN}")
    except ValueError:
        logger.exception("body crashed")
    (record,) = lines(stream)
    assert record["message"].startswith("body crashed [ValueError: bad key ")
    assert TOKEN not in stream.getvalue() and "Traceback" not in stream.getvalue()


def test_without_the_filter_an_exception_shows_its_type_only() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, (ValueError, ValueError(TOKEN), None))
    out = json.loads(JsonFormatter().format(record))
    assert out["error"] == "ValueError" and TOKEN not in json.dumps(out)
