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
  RQ's loop until Redis answers again, and the dispatcher re-rings. Both retries are
  bounded to REDIS_RETRY_SECONDS (RQ's own backoff grows to 60 s), so an idle worker
  listens again within about a second of Redis returning.
- RQ registers a worker in Redis once, at birth; a Redis that restarted empty, was
  flushed or failed over forgets it (django-rq's pages and ``rq.Worker.all()`` lose it).
  Every heartbeat checks the registration and puts it back, and an idle worker's
  heartbeat comes at least every LISTEN_SECONDS.
- Each process records how it ended on its WorkerProcess row (clean stop, crash, or a
  death found by the next start under its name): the dashboard's crash loop counts
  abnormal exits only. The exit is recorded as soon as RQ's loop has ended, before Koala
  logs anything more, and a gone stdout/stderr (``make run | tee``, then Ctrl-C) cannot
  prevent it (koala.log_handlers drops output on EPIPE; SIGPIPE is ignored).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from contextlib import suppress
from multiprocessing.process import BaseProcess
from typing import Any

import redis
from django.conf import settings
from django.db import connection, connections
from rq import SimpleWorker, Worker, worker_registration
from rq.exceptions import StopRequested
from rq.timeouts import BaseDeathPenalty
from rq.worker import WorkerStatus
from rq.worker_pool import ForkProcess, WorkerPool

from koala import redaction
from workers import bounds, doorbell, kinds, outcomes
from workers.bounds import get_bounds
from workers.models import WorkerExit
from workers.runtime import get_runtime
from workers.services import leases, processes

log = logging.getLogger("koala.worker")


class NoDeathPenalty(BaseDeathPenalty):
    def setup_death_penalty(self) -> None:
        pass

    def cancel_death_penalty(self) -> None:
        pass


def default_worker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


# Redis outages: how long a worker waits between attempts to reach Redis again, in RQ's
# dequeue loop and in Koala's restart of RQ's loop. This bounds how late an idle worker
# resumes after Redis returns (one more connect on top); one attempt a second per worker is
# nothing to a Redis that is up. redis-py's own per-command retries (10, backoff capped at
# 1 s) run inside each attempt and keep the same bound.
REDIS_RETRY_SECONDS = 1.0
# Longest an idle worker blocks on Redis before its next heartbeat (RQ's default is
# worker_ttl - 15 = 405 s): bounds how long a flushed Redis goes without this worker in
# its registry, and (with REDIS_POP_SLACK_SECONDS) how long a frozen master holds the pop.
# Costs one BLPOP and one pipelined heartbeat per interval per worker.
LISTEN_SECONDS = 2
# How much longer than a blocking pop's own timeout its socket waits for the reply.
REDIS_POP_SLACK_SECONDS = 2


class WorkerNameInUse(Exception):
    """Another live process holds this worker name (workers.services.processes decides)."""


class InvalidWorkerName(ValueError):
    """A worker name that django-rq's pages could not link to, or the database could not hold."""


# What a worker name may hold: the characters of host names and systemd instance names. Not
# "/" (django-rq's worker URL takes the name as one path segment: its worker list would fail
# to draw), ":" (a name must not read as a Redis key, "rq:worker:<name>"), spaces, control
# characters or NUL; at most WorkerProcess.name's 200 characters.
WORKER_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


def check_worker_name(name: str) -> str | None:
    """What is wrong with ``name`` as a worker name, or None."""
    if WORKER_NAME.fullmatch(name):
        return None
    shown = name if len(name) <= 60 else name[:60] + "…"
    return (
        f"invalid worker name {shown!r} ({len(name)} characters): use 1 to 200 letters, digits "
        "and . _ - @ + (it names the worker in Redis, in django-rq's page addresses and in the database)"
    )


class _Presence:
    """Keeps the WorkerProcess row fresh from a thread of the worker's main process, and
    records how the process ended (through workers.services.processes, the rows' one writer)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        hostname = socket.gethostname()
        try:
            processes.start(
                name=self.worker.name,
                hostname=hostname,
                pid=os.getpid(),
                queues=self.worker.queue_names(),
                kinds=[k.key for k in kinds.runnable()],
                worker_class=type(self.worker).__name__,
                this_host=hostname,
                contracts={k.key: k.contract_digest for k in kinds.runnable()},
            )
        except processes.WorkerNameInUse as exc:
            raise WorkerNameInUse(str(exc)) from None
        # The parent must hold no connection when it forks; the thread uses its own.
        connection.close()
        self.thread = threading.Thread(target=self._loop, name="koala-presence", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        interval = float(settings.KOALA_HEARTBEAT_SECONDS)
        try:
            while not self.stop.wait(interval):
                try:
                    processes.touch(names=[self.worker.name], pid=os.getpid())
                except Exception as exc:  # the database may be away for a while; keep trying
                    log.warning("worker presence update failed: %s", type(exc).__name__)
                    connection.close()
        finally:
            connection.close()

    def finish(self, exit: WorkerExit, detail: str) -> None:
        """Record how this process ended. Runs before the worker logs anything more: a log
        write is the one thing here that an outside event (a gone pipe) can make fail."""
        self.stop.set()
        try:
            processes.finish(name=self.worker.name, pid=os.getpid(), exit=exit, detail=detail)
        except Exception as exc:  # the database is away: the next start under this name records a death
            log.warning("worker %s: could not record its exit (%s)", self.worker.name, type(exc).__name__)
        finally:
            connection.close()


class KoalaWorkerMixin:
    death_penalty_class: type[BaseDeathPenalty] = NoDeathPenalty
    shutdown_deadline: float | None = None

    restart_delay_max = 30.0  # RQ's loop ending for another reason than Redis: back off
    redis_retry_seconds = REDIS_RETRY_SECONDS
    # RQ's dequeue loop sleeps 1, 2, 4 ... up to this between Redis attempts (RQ: 60 s).
    max_connection_wait_time = REDIS_RETRY_SECONDS

    @property
    def dequeue_timeout(self) -> int:
        return min(int(super().dequeue_timeout), LISTEN_SECONDS)  # type: ignore[misc]

    @property
    def connection_timeout(self) -> int:
        """The socket timeout RQ gives this worker's Redis connection, at least (RQ: the pop's
        timeout + 10 s). A frozen or partitioned master answers nothing, so every command on
        it, the blocking pop included, waits this long before the worker reconnects (through
        the sentinels, to the promoted replica); a fork worker can meet it twice (horse, then
        parent). The pop's reply comes within its own timeout: 2 s more is ample."""
        return self.dequeue_timeout + REDIS_POP_SLACK_SECONDS

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        problem = check_worker_name(self.name)  # type: ignore[attr-defined]
        if problem:  # before anything is recorded under it, in PostgreSQL or Redis
            raise InvalidWorkerName(problem)
        # A pool forks its workers from a parent that may hold connections.
        for conn in connections.all(initialized_only=True):
            conn.close()
        runtime = get_runtime()
        runtime.configure(name=self.name, queues=self.queue_names())  # type: ignore[attr-defined]
        self.prepare_bounds()
        presence = _Presence(self)
        presence.start()  # raises WorkerNameInUse before anything is recorded
        try:
            worked = self._serve(runtime, burst, *args, **kwargs)
        except (KeyboardInterrupt, SystemExit) as exc:
            # Ctrl-C before RQ's handlers were installed, or RQ's cold shutdown (a second
            # Ctrl-C): an operator stopped it; nothing crashed.
            presence.finish(WorkerExit.STOPPED, f"forced ({type(exc).__name__})")
            raise
        except BaseException as exc:
            stopping = runtime.shutdown_requested.is_set()
            presence.finish(WorkerExit.STOPPED if stopping else WorkerExit.CRASHED, type(exc).__name__)
            raise
        presence.finish(WorkerExit.STOPPED, getattr(self, "_stop_signal", "") or ("burst done" if burst else "RQ loop ended"))
        return worked

    def prepare_bounds(self) -> None:
        """Per-attempt ceilings (workers.bounds): what this worker class does about them at start."""

    def _serve(self, runtime: Any, burst: bool, *args: Any, **kwargs: Any) -> bool:
        worked = False
        delay = 1.0
        while True:
            began = time.monotonic()
            redis_away = False
            try:
                worked = bool(super().work(burst, *args, **kwargs)) or worked  # type: ignore[misc]
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                # RQ's loop quit on a Redis error and its teardown could not reach Redis either
                # (or Redis was still away when the loop restarted).
                redis_away = True
                log.warning("worker %s: Redis unreachable (%s)", self.name, type(exc).__name__)  # type: ignore[attr-defined]
            if burst or runtime.shutdown_requested.is_set():
                return worked
            if redis_away:
                # No backoff: retrying Redis costs one connect, and the sooner it answers the
                # sooner this worker listens again (REDIS_RETRY_SECONDS bounds that).
                wait = self.redis_retry_seconds
            else:
                # RQ's loop ended without a stop request: an error outside its dequeue retry,
                # such as Redis going away while a message was being recorded. Serve again.
                if time.monotonic() - began > 60:
                    delay = 1.0
                wait = delay
                delay = min(delay * 2, self.restart_delay_max)
                log.error(
                    "worker %s: RQ's work loop stopped unexpectedly; restarting it in %.0fs",
                    self.name,  # type: ignore[attr-defined]
                    wait,
                )
            try:
                if runtime.shutdown_requested.wait(wait):
                    return worked
            except StopRequested:  # SIGTERM while waiting
                return worked
            # Most restarts follow a Redis error. The pool may still hold idle connections to a
            # master that is gone: frozen or partitioned, each would cost a socket timeout before
            # it is dropped. Closing them all makes the next command connect afresh, which under
            # Sentinel asks the sentinels for the current master.
            with suppress(Exception):
                self.connection.connection_pool.disconnect()  # type: ignore[attr-defined]
            self._forget_registration()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's heartbeat, plus a check that Redis still lists this worker, in one round trip.

        A restarted (empty), flushed or failed-over Redis has forgotten the registration
        RQ made at birth; RQ's heartbeat would only recreate a hash holding last_heartbeat,
        so django-rq's pages and ``rq.Worker.all()`` would not list this live worker again.
        """
        if pipeline is not None:  # part of RQ's own pipeline around a job: RQ executes it
            super().heartbeat(timeout, pipeline=pipeline)  # type: ignore[misc]
            return
        with self.connection.pipeline(transaction=False) as batch:  # type: ignore[attr-defined]
            super().heartbeat(timeout, pipeline=batch)  # type: ignore[misc]
            batch.sismember(self.redis_workers_keys, self.key)  # type: ignore[attr-defined]
            batch.hexists(self.key, "queues")  # type: ignore[attr-defined]
            *_, listed, described = batch.execute()
        if not (listed and described):
            self._register_again()

    def maintain_heartbeats(self, job: Any) -> None:
        # The forking worker's heartbeat while its horse runs a job (every job_monitoring_interval).
        super().maintain_heartbeats(job)  # type: ignore[misc]
        with self.connection.pipeline(transaction=False) as batch:  # type: ignore[attr-defined]
            batch.sismember(self.redis_workers_keys, self.key)  # type: ignore[attr-defined]
            batch.hexists(self.key, "queues")  # type: ignore[attr-defined]
            listed, described = batch.execute()
        if not (listed and described):
            self._register_again()

    def _register_again(self) -> None:
        """Put back what register_birth wrote: the worker's hash and its registry sets.

        Runs on the worker's main thread only (the heartbeat's), so it can never race RQ's
        register_death at teardown and resurrect a stopped worker.
        """
        if self.birth_date is None or self.last_heartbeat is None:  # type: ignore[attr-defined]
            return  # not born yet: register_birth will do it
        with self.connection.pipeline() as batch:  # type: ignore[attr-defined]
            batch.hset(self.key, mapping={**self.serialize(), "state": self.get_state()})  # type: ignore[attr-defined]
            worker_registration.register(self, batch)  # type: ignore[arg-type]
            batch.expire(self.key, self.worker_ttl + 60)  # type: ignore[attr-defined]
            batch.execute()
        log.warning("worker %s: Redis had forgotten this worker (restart, flush or failover); registered it again", self.name)  # type: ignore[attr-defined]

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
        if host is not None and death is None and host == socket.gethostname() and pid and not processes.pid_alive(int(pid)):
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
        self._stop_signal = signal.Signals(signum).name  # recorded as the clean exit's detail
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
        get_bounds().enable_in_horse()  # the ceilings bound this horse alone, never the parent

    def prepare_bounds(self) -> None:
        # The page each horse writes its limited attempt to, mapped once before any fork.
        get_bounds().prepare_parent()

    def handle_work_horse_killed(self, job: Any, retpid: Any, ret_val: Any, rusage: Any) -> None:
        """The horse died without finishing its RQ message. If a body was running under a ceiling
        and the death is that ceiling's (SIGKILL at the CPU hard limit, an exit while a memory
        ceiling held), record the attempt's end under its name now, through the one transition
        writer, instead of leaving it to the reaper after the lease expires."""
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        slate = get_bounds().slate
        written = slate.read() if slate is not None else None
        if written is None:
            return
        slate.clear()  # type: ignore[union-attr]
        cpu_used = rusage.ru_utime + rusage.ru_stime if rusage is not None else None
        limit = bounds.cause_of_death(written, ret_val, cpu_used)
        if limit is None:
            return
        try:
            held = leases.lease_of(attempt_id=written.attempt_id)
            if held is None or held.outcome is not None or held.lease.lease_token != written.lease_token:
                return  # the attempt's end is recorded already, or the job has moved on
            lease = held.lease
            kind = kinds.get(lease.kind, lease.version)
            if kind is None:
                return
            ending = outcomes.OverLimit(limit=limit, limits=written.limits, killed=True)
            with redaction.bind(kind.redactor(lease.input)):
                get_runtime()._report(lease, outcomes.decide(ending, lease, kind))
        except Exception as exc:  # the database is away: the lease expires and the reaper decides
            log.warning("worker %s: could not record the killed work horse's attempt (%s)", self.name, type(exc).__name__)
        finally:
            connection.close()  # the parent holds no connection when it forks


class KoalaSimpleWorker(KoalaWorkerMixin, SimpleWorker):
    """Runs bodies in the worker process itself: fastest; use for well-behaved bodies.

    It enforces no per-attempt memory or CPU ceiling (there is no horse to bound): it says so
    at start when one is configured (workers.bounds.warn_unenforced)."""

    def prepare_bounds(self) -> None:
        bounds.warn_unenforced("simple")


WORKER_CLASSES: dict[str, type[Worker] | type[SimpleWorker]] = {"fork": KoalaWorker, "simple": KoalaSimpleWorker}


def _run_pool_member(
    name: str, queue_names: list[str], *, worker_class: Any, burst: bool, logging_level: str, _sleep: float = 0, **options: Any
) -> None:
    """RQ's ``run_worker`` for one pool member, with its Redis client made by koala/redis_client.py."""
    doorbell.reset_connection()  # forked: never share the parent's sockets
    connection = doorbell.redis_connection()
    worker = worker_class([doorbell.rq_queue(q) for q in queue_names], name=name, connection=connection, **options)
    time.sleep(_sleep)
    # No RQ scheduler (RQ's pool starts one per member): Koala schedules in PostgreSQL and never
    # enqueues an RQ message for later, so, like a single worker, a member runs none. One would
    # also add its own Redis waits to a member's recovery from a frozen master.
    worker.work(burst=burst, logging_level=logging_level)


class KoalaWorkerPool(WorkerPool):
    """RQ's pool, except for how a member gets its Redis connection.

    RQ rebuilds each member's client from the parent's connection class, pool class and pool
    keyword arguments. A Sentinel-managed pool cannot travel that way (its connections ask the
    pool, which asks the sentinels, for the master's address): rebuilt, a member would connect to
    localhost. Each member makes its client itself, the one way every Koala process does.
    """

    def get_worker_process(self, name: str, burst: bool, _sleep: float = 0, logging_level: str = "INFO") -> BaseProcess:
        return ForkProcess(
            target=_run_pool_member,
            args=(name, self._queue_names),
            kwargs={
                "_sleep": _sleep,
                "burst": burst,
                "logging_level": logging_level,
                "worker_class": self.worker_class,
                "job_class": self.job_class,
                "serializer": self.serializer,
                "exception_handlers": self.exception_handlers,
            },
            name=f"Worker {name} (WorkerPool {self.name})",
        )
