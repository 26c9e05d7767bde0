"""The console handler outlives its reader: a closed pipe drops output, not the process's work."""

from __future__ import annotations

import logging
import os

import pytest

from koala.log_handlers import PipeSafeStreamHandler


def test_a_closed_pipe_drops_output_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", buffering=1)
    handler = PipeSafeStreamHandler(stream)
    logger = logging.getLogger("koala.test.pipe")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("before")  # the reader is there
        assert os.read(read_end, 100).endswith(b"before\n")
        os.close(read_end)  # tee is gone
        logger.warning("after")  # EPIPE inside emit()
        logger.warning("and later")
        handler.flush()
        assert stream is not handler.stream  # switched to /dev/null once, not retried per record
        assert "Logging error" not in capsys.readouterr().err  # the stock handler prints a traceback per record
    finally:
        logger.removeHandler(handler)
        handler.stream.close()
        try:
            stream.close()
        except BrokenPipeError:
            pass
