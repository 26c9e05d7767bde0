"""A real SMTP server on 127.0.0.1 (aiosmtpd) that records every message it accepts.

Django's SMTP email backend talks to it over a socket exactly as it would to a mail relay.
Each accepted message is appended (and fsync'ed) to a JSON-lines file before the server
answers ``250``, with its Message-ID and Koala's ``X-Koala-Idempotency-Key`` header, so
tests in any process count deliveries from the outside world's own record.

Faults, set on the object (the sink runs in the test process; workers reach it over TCP):
- ``hold_seconds``: accept and record the message, then hold the ``250`` reply that long (a
  worker killed meanwhile has delivered the message without learning it);
- ``reply``: answer DATA with this line instead (``"451 4.3.0 Try again later"``,
  ``"550 5.7.1 Rejected"``) without recording, for ``reply_times`` messages (None: until cleared).

Also runnable as a process: ``python -m tests.fakes.smtp --port 8025 --record /tmp/mail.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

IDEMPOTENCY_HEADER = "X-Koala-Idempotency-Key"


def read_messages(record: Path) -> list[dict[str, Any]]:
    try:
        with open(record) as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


class RecordingHandler:
    def __init__(self, record: Path) -> None:
        self.record = record
        self.hold_seconds = 0.0
        self.reply: str | None = None
        self.reply_times: int | None = None
        self.sessions = 0

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.reply is not None and (self.reply_times is None or self.reply_times > 0):
            if self.reply_times is not None:
                self.reply_times -= 1
            return self.reply
        content = envelope.original_content or envelope.content or b""
        raw = content if isinstance(content, bytes) else content.encode()
        message = message_from_bytes(raw, policy=policy.default)
        body = message.get_body(preferencelist=("plain", "html"))
        entry = {
            "message_id": str(message.get("Message-ID", "")),
            "idempotency_key": str(message.get(IDEMPOTENCY_HEADER, "")),
            "mail_from": envelope.mail_from,
            "rcpt_tos": list(envelope.rcpt_tos),
            "subject": str(message.get("Subject", "")),
            "body": body.get_content() if body is not None else "",
            "sha256": hashlib.sha256(raw).hexdigest(),
            "at": time.time(),
        }
        fd = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.hold_seconds:
            await asyncio.sleep(self.hold_seconds)
        return "250 2.0.0 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SmtpSink:
    """The SMTP server in a thread of this process (the ``smtp_sink`` fixture's way)."""

    def __init__(self, record: Path, *, port: int = 0) -> None:
        self.record = Path(record)
        self.handler = RecordingHandler(self.record)
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.controller = Controller(self.handler, hostname=self.host, port=self.port, server_hostname="koala-smtp-sink")

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    def messages(self, idempotency_key: str | None = None) -> list[dict[str, Any]]:
        return [m for m in read_messages(self.record) if idempotency_key in (None, m["idempotency_key"])]

    def hold(self, seconds: float) -> None:
        self.handler.hold_seconds = seconds

    def refuse(self, reply: str | None, *, times: int | None = None) -> None:
        self.handler.reply = reply
        self.handler.reply_times = times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An SMTP sink on 127.0.0.1 that records every message.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--record", type=Path, required=True)
    args = parser.parse_args(argv)
    sink = SmtpSink(args.record, port=args.port).start()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    print(f"smtp sink listening on {sink.host}:{sink.port} (record {args.record})", flush=True)
    stopped.wait()
    sink.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
