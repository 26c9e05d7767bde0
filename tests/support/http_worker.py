"""A tiny worker written against the protocol alone (standard library only), run as a subprocess:

    python -m tests.support.http_worker --url URL --key KEY --kinds http.probe@1 \
        --name N --concurrency C --log FILE

It registers, long-polls acquire, heartbeats each lease from a thread every ``heartbeat_seconds``
and runs one body for every kind: append ``start <job_id> <attempt> <pid>`` to the effect file
(``input.log``, else ``--log``; fsync), sleep ``input.seconds`` (``input.first_seconds`` on
attempt 1 when given) while watching for a stop, append ``end <job_id> <attempt> <pid>``, then
complete. The effect file is the outside world's record (tests/kinds.py ``effect``).

A 409 is handled by name: ``already_recorded`` is done; any other reason drops the lease (the
body stops, nothing is reported) and appends ``dropped <job_id> <attempt> <reason>``, the
worker's own record of what it was told. A heartbeat's ``cancel`` (a stop pause) stops the body
at its next check and gives the lease back with ``fail`` ``released`` at a safe point.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from typing import Any


def effect(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Client:
    def __init__(self, url: str, key: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.key = key

    def post(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
            )
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        return response.status, (json.loads(data) if data else None)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.client = Client(args.url, args.key)
        self.log = args.log
        self.concurrency = args.concurrency
        self.wait = args.wait
        kinds = [k for item in args.kinds for k in item.split(",") if k]
        status, body = self.call(
            "/api/v1/workers/register",
            {
                "name": args.name,
                "kinds": kinds,
                "concurrency": args.concurrency,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
            },
        )
        if status != 200:
            raise SystemExit(f"register answered {status}: {body}")
        self.worker_id: str = body["worker_id"]
        self.heartbeat_seconds = float(body["heartbeat_seconds"])
        self.running = 0
        self.slots = threading.Condition()

    def call(self, path: str, body: dict[str, Any], timeout: float = 30.0) -> tuple[int, Any]:
        """POST, retrying while the server cannot be reached (a restart): the protocol is the same after."""
        while True:
            try:
                return self.client.post(path, body, timeout=timeout)
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)

    def lease_call(self, lease: dict[str, Any], what: str, **fields: Any) -> tuple[int, Any]:
        body = {"worker_id": self.worker_id, "lease_token": lease["lease_token"], **fields}
        return self.call(f"/api/v1/leases/{lease['lease_id']}/{what}", body)

    def serve(self) -> None:
        while True:
            with self.slots:
                while self.running >= self.concurrency:
                    self.slots.wait()
                free = self.concurrency - self.running
            status, body = self.call(
                f"/api/v1/workers/{self.worker_id}/acquire", {"max": free, "wait_seconds": self.wait}, timeout=self.wait + 30
            )
            if status == 204:
                continue
            if status != 200:  # 429 (a lease still counted as held) or a passing server error
                time.sleep(0.2)
                continue
            for lease in body["leases"]:
                with self.slots:
                    self.running += 1
                threading.Thread(target=self.run, args=(lease,), daemon=True).start()

    def run(self, lease: dict[str, Any]) -> None:
        try:
            self.body(lease)
        finally:
            with self.slots:
                self.running -= 1
                self.slots.notify()

    def body(self, lease: dict[str, Any]) -> None:
        data = lease["input"] if isinstance(lease["input"], dict) else {}
        log = str(data.get("log") or self.log)
        job_id, attempt = lease["job_id"], lease["attempt"]
        stop = threading.Event()
        finished = threading.Event()
        told: list[str] = []  # why the body must stop: a 409 reason, or "stop_pause"

        def beat() -> None:
            while not finished.wait(self.heartbeat_seconds):
                status, answer = self.lease_call(lease, "heartbeat")
                if status == 409:
                    told.append(answer["error"])
                    stop.set()
                    return
                if status == 200 and answer.get("cancel"):
                    told.append(answer.get("reason") or "cancel")
                    stop.set()
                    return

        heart = threading.Thread(target=beat, daemon=True)
        heart.start()
        try:
            effect(log, f"start {job_id} {attempt} {os.getpid()}")
            seconds = data.get("first_seconds") if attempt == 1 and "first_seconds" in data else data.get("seconds", 0)
            deadline = time.monotonic() + float(seconds or 0)
            while time.monotonic() < deadline and not stop.is_set():
                stop.wait(min(0.02, max(0.0, deadline - time.monotonic())))
            if stop.is_set():
                reason = told[0] if told else "stopped"
                if reason in ("stop_pause", "cancel"):
                    self.lease_call(lease, "fail", classification="released", safe_point=True)
                effect(log, f"dropped {job_id} {attempt} {reason}")
                return
            effect(log, f"end {job_id} {attempt} {os.getpid()}")
        finally:
            finished.set()
        status, answer = self.lease_call(lease, "complete", output={"pid": os.getpid(), "worker": self.worker_id})
        if status == 409 and answer["error"] != "already_recorded":
            effect(log, f"dropped {job_id} {attempt} {answer['error']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--kinds", action="append", required=True, help="name@version, comma-separated or repeated")
    parser.add_argument("--name", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--log", required=True, help="the effect file when a job's input names none")
    parser.add_argument("--wait", type=float, default=5.0, help="acquire's wait_seconds")
    args = parser.parse_args(argv)
    Worker(args).serve()


if __name__ == "__main__":
    sys.exit(main())
