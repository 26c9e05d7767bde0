"""RQ worker classes that run Koala's entry safely.

- RQ's job timeout is not used (``NoDeathPenalty``): Koala enforces per-attempt
  limits itself, per job, inside a batch.
- SIGTERM/SIGINT: stop claiming, let the running body finish within the shutdown
  deadline, then release it (no attempt used). The forking worker forwards the
  signal to its work horse, where the body runs.
- Django's database connections must never be shared across fork: the parent
  closes its connections before forking; the horse opens its own.
- A Redis outage never ends the worker. RQ retries Redis only while it waits for a
  message; an outage that hits its bookkeeping around a message makes RQ's loop quit
  (and its teardown raise). The jobs are safe in PostgreSQL, so the worker restarts
  RQ's loop with a backoff until Redis answers again, and the dispatcher re-rings.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from contextlib import suppress
from typing import Any

import redis
from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone
from rq import SimpleWorker, Worker, worker_registration
from rq.exceptions import StopRequested
from rq.timeouts import BaseDeathPenalty
from rq.worker import WorkerStatus

from workers import kinds
from workers.models import WorkerProcess
from workers.runtime import get_runtime

log = logging.getLogger("koala.worker")


class NoDeathPenalty(BaseDeathPenalty):
    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


def default_worker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


RECENT_STARTS_KEPT = 20


class _Presence:
    """Keeps the WorkerProcess row fresh from a thread of the worker's main process."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        now = timezone.now()
        with transaction.atomic():
            row = WorkerProcess.objects.select_for_update().filter(name=self.worker.name).first()
            starts = [*(row.recent_starts if row is not None else []), now.isoformat()][-RECENT_STARTS_KEPT:]
            WorkerProcess.objects.update_or_create(
                name=self.worker.name,
                defaults={
                    "hostname": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": self.worker.queue_names(),
                    "kinds": [k.key for k in kinds.served()],
                    "worker_class": type(self.worker).__name__,
                    "started_at": now,
                    "last_seen_at": now,
                    "stopped_at": None,
                    "recent_starts": starts,
                },
            )
        # The parent must hold no connection when it forks; the thread uses its own.
        connection.close()
        self.thread = threading.Thread(target=self._loop, name="koala-presence", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        interval = float(settings.KOALA_HEARTBEAT_SECONDS)
        try:
            while not self.stop.wait(interval):
                try:
                    WorkerProcess.objects.filter(name=self.worker.name).update(last_seen_at=timezone.now())
                except Exception as exc:  # the database may be away for a while; keep trying
                    log.warning("worker presence update failed: %s", type(exc).__name__)
                    connection.close()
        finally:
            connection.close()

    def finish(self) -> None:
        self.stop.set()
        try:
            WorkerProcess.objects.filter(name=self.worker.name).update(stopped_at=timezone.now(), last_seen_at=timezone.now())
        finally:
            connection.close()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own pid, held by an earlier incarnation (pids repeat in containers)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


class KoalaWorkerMixin:
    death_penalty_class: type[BaseDeathPenalty] = NoDeathPenalty
    shutdown_deadline: float | None = None

    restart_delay_max = 30.0

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        # A pool forks its workers from a parent that may hold connections.
        for conn in connections.all(initialized_only=True):
            conn.close()
        runtime = get_runtime()
        runtime.configure(name=self.name, queues=self.queue_names())  # type: ignore[attr-defined]
        presence = _Presence(self)
        presence.start()
        worked = False
        delay = 1.0
        try:
            while True:
                began = time.monotonic()
                try:
                    worked = bool(super().work(burst, *args, **kwargs)) or worked  # type: ignore[misc]
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    # RQ's loop quit on a Redis error and its teardown could not reach Redis either
                    # (or Redis was still away when the loop restarted).
                    log.warning("worker %s: Redis unreachable (%s)", self.name, type(exc).__name__)  # type: ignore[attr-defined]
                if burst or runtime.shutdown_requested.is_set():
                    return worked
                # RQ's loop ended without a stop request: an error outside its dequeue retry,
                # such as Redis going away while a message was being recorded. Serve again.
                if time.monotonic() - began > 60:
                    delay = 1.0
                log.error(
                    "worker %s: RQ's work loop stopped unexpectedly; restarting it in %.0fs",
                    self.name,  # type: ignore[attr-defined]
                    delay,
                )
                try:
                    if runtime.shutdown_requested.wait(delay):
                        return worked
                except StopRequested:  # SIGTERM while waiting
                    return worked
                delay = min(delay * 2, self.restart_delay_max)
                self._forget_registration()
        finally:
            presence.finish()

    def register_birth(self) -> None:
        """Take over the name from a previous incarnation that died without registering its death.

        RQ refuses a name whose Redis key has no death mark until the key expires (worker_ttl
        + 60 s, 8 minutes by default). A worker with a fixed name (a systemd instance) that
        was killed with -9 or by the OOM killer would then fail every restart for minutes: a
        crash loop made by the registry. If the key's holder ran on this host and its pid is
        gone, it is us from before; a live holder or another host is a real name clash.
        """
        conn = self.connection  # type: ignore[attr-defined]
        key = self.key  # type: ignore[attr-defined]
        holder = conn.hmget(key, "hostname", "pid", "death")
        host, pid, death = (v.decode() if isinstance(v, bytes) else v for v in holder)
        if host is not None and death is None and host == socket.gethostname() and pid and not _pid_alive(int(pid)):
            log.warning("worker %s: taking over the name from dead pid %s", self.name, pid)  # type: ignore[attr-defined]
            with conn.pipeline() as pipeline:
                worker_registration.unregister(self, pipeline)  # type: ignore[arg-type]
                pipeline.delete(key)
                pipeline.execute()
        super().register_birth()  # type: ignore[misc]

    def _forget_registration(self) -> None:
        """Before RQ's loop starts again: drop the previous run's Redis registration and
        pubsub thread, which a failed teardown may have left behind (the name is ours)."""
        with suppress(Exception):
            self.unsubscribe()  # type: ignore[attr-defined]
        self.pubsub_thread = None
        with suppress(redis.exceptions.RedisError):
            with self.connection.pipeline() as pipeline:  # type: ignore[attr-defined]
                worker_registration.unregister(self, pipeline)  # type: ignore[arg-type]
                pipeline.delete(self.key)  # type: ignore[attr-defined]
                pipeline.execute()

    def request_stop(self, signum: int, frame: Any) -> None:
        get_runtime().request_shutdown(self.shutdown_deadline)
        horse = getattr(self, "_horse_pid", 0)
        if horse:
            try:
                os.kill(horse, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            super().request_stop(signum, frame)  # type: ignore[misc]
        except redis.exceptions.RedisError as exc:
            # RQ records the request in Redis from inside this signal handler. With Redis away
            # that raises, and in the simple worker the exception would land inside the running
            # body and fail its job. The stop itself needs no Redis.
            log.warning("worker %s: could not record the stop request in Redis (%s)", self.name, type(exc).__name__)  # type: ignore[attr-defined]
            self._stop_requested = True
            if self.get_state() != WorkerStatus.BUSY:  # type: ignore[attr-defined]
                raise StopRequested() from None


class KoalaWorker(KoalaWorkerMixin, Worker):
    """Forks a work horse per RQ message (one message runs a batch of Koala jobs).

    Use when bodies may leak memory or crash the interpreter: each wake gets a fresh process.
    """

    def fork_work_horse(self, job: Any, queue: Any) -> None:
        for conn in connections.all(initialized_only=True):
            conn.close()
        super().fork_work_horse(job, queue)

    def setup_work_horse_signals(self) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Forwarded by the parent (and sent by systemd to the whole cgroup): graceful stop.
        signal.signal(signal.SIGTERM, lambda signum, frame: get_runtime().request_shutdown(self.shutdown_deadline))


class KoalaSimpleWorker(KoalaWorkerMixin, SimpleWorker):
    """Runs bodies in the worker process itself: fastest; use for well-behaved bodies."""


WORKER_CLASSES: dict[str, type[Worker] | type[SimpleWorker]] = {"fork": KoalaWorker, "simple": KoalaSimpleWorker}
