"""A console log handler that a gone reader cannot turn into an error.

`make run | tee log`, then Ctrl-C: tee is gone and every later write to the pipe fails
with EPIPE. Python ignores SIGPIPE, so a write raises BrokenPipeError; the stock
StreamHandler then prints a traceback per record to stderr (often the same gone pipe).
A worker must still finish its job, release what it holds and record its stop, so once
its stream is gone this handler drops the output quietly instead.
"""

from __future__ import annotations

import errno
import logging
import os
import sys


class PipeSafeStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        gone = isinstance(error, BrokenPipeError) or (isinstance(error, OSError) and error.errno == errno.EPIPE)
        closed = isinstance(error, ValueError) and "closed file" in str(error)
        if gone or closed:
            # Nobody reads this stream any more: later records go nowhere, at no cost. Not
            # setStream(): it flushes the old stream first, which fails the same way. (Called
            # from emit() under the handler's re-entrant lock.)
            self.stream = open(os.devnull, "w", encoding="utf-8")
            return
        super().handleError(record)
