"""The worker loop: register, long-poll for leases, run bodies, heartbeat, report (docs/worker-api.md)."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from koala_worker.backoff import backoff_delay
from koala_worker.client import Client
from koala_worker.context import Context
from koala_worker.errors import (
    Abandon,
    AlreadyRecorded,
    ApiError,
    Rejected,
    RetryableError,
    StepFailure,
    StopRequested,
)
from koala_worker.lease import Lease, Registration
from koala_worker.workflow import Workflow

log = logging.getLogger("koala_worker")

Body = Callable[[Context, Any], Any]
T = TypeVar("T")
MAX_MESSAGE_CHARS = 4000
MAX_RETRY_AFTER = 86400.0  # the contract's bound on retry_after
BEAT_TICK_SECONDS = 1.0  # the heartbeat thread looks at least this often (new leases, a stop)


def error_class_name(name: str) -> str:
    """A name Koala accepts as ``error_class`` (a letter or _, then letters, digits, ``_ . : -``)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.:-]", "_", name)[:200]
    if not cleaned or not (cleaned[0].isascii() and (cleaned[0].isalpha() or cleaned[0] == "_")):
        cleaned = ("_" + cleaned)[:200]
    return cleaned


def failure_payload(exc: BaseException) -> dict[str, Any]:
    """How a body's exception is reported: ``fail``'s fields. The message only, never a traceback."""
    message = (str(exc) or type(exc).__name__)[:MAX_MESSAGE_CHARS]
    if isinstance(exc, RetryableError):
        payload: dict[str, Any] = {"classification": "retryable", "error_class": type(exc).__name__, "message": message}
        if exc.retry_after is not None:
            payload["retry_after"] = min(max(0.0, float(exc.retry_after)), MAX_RETRY_AFTER)
        return payload
    if isinstance(exc, StepFailure):
        return {"classification": "step_failure", "error_class": error_class_name(exc.error_class), "message": message}
    return {"classification": "fatal", "error_class": error_class_name(type(exc).__name__), "message": message}


def _jsonable(value: Any) -> str | None:
    """Why ``value`` cannot be sent as JSON, or None."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


class LeaseRun:
    """One lease this worker holds, from acquire until its one report (or until it is dropped)."""

    def __init__(self, worker: Worker, lease: Lease) -> None:
        self.worker = worker
        self.lease = lease
        self.lock = threading.Lock()
        self.started = False
        self.finished = False  # its report was sent, or it was dropped: nothing more about it
        self.rejection: str | None = None  # the 409 reason that took the lease away
        self.stop_requested = False  # a stop pause (cancel: true) or a shutdown
        self.next_beat = time.monotonic() + lease.heartbeat_seconds
        self.ctx = Context(self)

    def claim_start(self) -> bool:
        with self.lock:
            if self.finished:
                return False
            self.started = True
            return True

    def claim_report(self) -> bool:
        """True for the one caller that may report about this lease (the body's thread or the shutdown)."""
        with self.lock:
            if self.finished or self.rejection is not None:
                return False
            self.finished = True
            return True

    def reject(self, reason: str) -> None:
        """The lease is gone: stop the body, report nothing."""
        with self.lock:
            self.rejection = reason
        self.ctx.cancelled.set()

    def request_stop(self) -> None:
        self.stop_requested = True
        self.ctx.cancelled.set()


class Worker:
    """``Worker(client, concurrency=8).register("send_invoice", version=2, body=send_invoice)``; then ``serve()``."""

    def __init__(
        self,
        client: Client,
        *,
        concurrency: int = 8,
        name: str | None = None,
        queues: list[str] | None = None,
        shutdown_deadline: float = 30.0,
    ) -> None:
        if not 1 <= concurrency <= 256:
            raise ValueError("concurrency must be 1-256")
        self.client = client
        self.concurrency = concurrency
        self.name = name
        self.queues = queues
        self.shutdown_deadline = shutdown_deadline
        self.bodies: dict[tuple[str, int], dict[str | None, Body]] = {}
        self.step_ids: dict[tuple[str, int], list[str]] = {}
        self.workflows: dict[tuple[str, int], Workflow] = {}
        self.worker_id = ""
        self.registration: Registration | None = None
        self._held: dict[int, LeaseRun] = {}
        self._cond = threading.Condition()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._work: queue.Queue[LeaseRun | None] = queue.Queue()
        self._beat_wake = threading.Event()
        self._serve_thread: int | None = None
        self._deadline: float | None = None
        self._stop_reason = ""
        self.hostname = socket.gethostname()

    # -- what it serves --------------------------------------------------------------------

    def register(
        self,
        name: str | Body | Workflow,
        version: int = 1,
        body: Body | None = None,
        steps: Iterable[str] | Mapping[str, Body] = (),
    ) -> Any:
        """Serve kind ``name`` at ``version`` with ``body(ctx, input)``, or the steps of a workflow.

        ``worker.register(support)`` (a ``Workflow``) serves the steps it has bodies for, at its
        version; the server knows the definition (``remote_step``) and answers ``400`` for a
        workflow, version or step it does not.

        ``worker.register("echo", 1, echo)`` and ``worker.register(echo)`` (the function's name)
        return the worker, for chaining; ``@worker.register("echo", version=1)`` is a decorator.
        ``steps``: the step ids of a kind of several steps, each run by ``body`` (which reads
        ``ctx.step``), or a mapping of step id to its own body.
        """
        if isinstance(name, Workflow):
            if not name.bodies:
                raise ValueError(f"{name.key} has no step bodies to serve")
            self.workflows[(name.name, name.version)] = name
            return self
        if callable(name):
            body, name = name, str(getattr(name, "koala_kind", name.__name__))
            version = int(getattr(body, "koala_version", version))
        if body is None and not isinstance(steps, Mapping):

            def decorator(fn: Body) -> Body:
                self.register(str(name), version, fn, steps)
                return fn

            return decorator
        key = (str(name), int(version))
        table: dict[str | None, Body] = {}
        if body is not None:
            table[None] = body
        if isinstance(steps, Mapping):
            table.update({str(step): fn for step, fn in steps.items()})
            ids = [str(step) for step in steps]
        else:
            ids = [str(step) for step in steps]
            if body is not None:
                table.update({step: body for step in ids})
        self.bodies[key] = table
        self.step_ids[key] = ids
        return self

    def kinds_payload(self) -> list[dict[str, Any]]:
        served = [{"name": name, "version": version, "steps": self.step_ids[(name, version)]} for name, version in self.bodies]
        return served + [flow.payload() for flow in self.workflows.values()]

    def body_for(self, lease: Lease) -> Body | None:
        if lease.step is not None and lease.kind.endswith(f".{lease.step}"):
            flow = self.workflows.get((lease.kind[: -len(lease.step) - 1], lease.version))
            if flow is not None:
                return flow.body_for(lease.kind, lease.step)
        table = self.bodies.get((lease.kind, lease.version))
        if table is None:
            return None
        return table.get(lease.step)

    # -- talking to Koala --------------------------------------------------------------------

    def _wait(self, seconds: float) -> bool:
        """Sleep, unless a stop comes first (True when stopping)."""
        return self._stopping.wait(seconds)

    def persist(self, call: Callable[[], T], run: LeaseRun | None = None) -> T:
        """``call()``, again after transient errors (no answer, 5xx, 429) until the lease can no longer be held.

        A server restart should not lose a finished step: the report is repeated (Koala answers a
        repeat ``already_recorded``) until an answer comes, or until the lease would have expired
        twice over (then the server, when it is back, has given the job to someone else anyway).
        """
        lease_seconds = run.lease.lease_seconds if run else 30.0
        give_up = time.monotonic() + 2 * lease_seconds + 10.0
        failures = 0
        while True:
            try:
                return call()
            except ApiError as exc:
                if not exc.transient or time.monotonic() > give_up or self._done.is_set():
                    raise
                failures += 1
                delay = exc.retry_after if exc.status == 429 and exc.retry_after is not None else backoff_delay(failures)
                log.warning("koala: %s; trying again in %.1fs", exc, delay)
                time.sleep(delay)

    def _register(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                reg = self.client.register(
                    kinds=self.kinds_payload(),
                    concurrency=self.concurrency,
                    name=self.name or self.worker_id or None,
                    hostname=self.hostname,
                    pid=os.getpid(),
                    queues=self.queues,
                )
            except ApiError as exc:
                if not exc.transient:
                    raise
                failures += 1
                self._wait(exc.retry_after if exc.retry_after is not None else backoff_delay(failures))
                continue
            self.registration = reg
            self.worker_id = reg.worker_id
            log.info("koala: registered as %s (concurrency %s)", reg.worker_id, reg.concurrency)
            return

    def _report(self, run: LeaseRun, call: Callable[[], Any]) -> None:
        try:
            self.persist(call, run)
        except AlreadyRecorded:
            pass  # a repeat after a lost answer: the first one landed
        except Rejected as exc:
            log.info("koala: lease %s of job %s: %s; dropped", run.lease.lease_id, run.lease.job_id, exc.reason.value)
        except ApiError as exc:
            log.error("koala: lease %s of job %s: report refused: %s", run.lease.lease_id, run.lease.job_id, exc)

    def _fail(self, run: LeaseRun, **payload: Any) -> None:
        self._report(run, lambda: self.client.fail(self.worker_id, run.lease, **payload))

    def _release(self, run: LeaseRun, *, body_started: bool, safe_point: bool) -> None:
        why = "the worker is shutting down" if self._stopping.is_set() else "a stop pause"
        self._fail(
            run,
            classification="released",
            error_class="Released",
            message=why,
            body_started=body_started,
            safe_point=safe_point,
        )

    # -- running bodies ----------------------------------------------------------------------

    def _pool(self) -> None:
        while True:
            run = self._work.get()
            if run is None:
                return
            try:
                self._run(run)
            except Exception:  # never lose a pool thread
                log.exception("koala: lease %s: worker error", run.lease.lease_id)
            finally:
                with self._cond:
                    self._held.pop(run.lease.lease_id, None)
                    self._cond.notify_all()

    def _run(self, run: LeaseRun) -> None:
        lease = run.lease
        body = self.body_for(lease)
        if body is None:
            if run.claim_report():
                where = f"{lease.kind}@{lease.version}" + (f" step {lease.step}" if lease.step else "")
                self._fail(run, classification="unservable", error_class="Unservable", message=f"no body for {where} here")
            return
        if self._stopping.is_set():
            if run.claim_report():
                self._release(run, body_started=False, safe_point=False)
            return
        if not run.claim_start():
            return
        ctx = run.ctx
        began = time.monotonic()
        try:
            output = body(ctx, ctx.input)
        except Abandon as exc:
            log.info("koala: lease %s of job %s: stopped (%s)", lease.lease_id, lease.job_id, exc.why)
            return
        except StopRequested:
            if run.claim_report():
                self._beat_progress(run)
                self._release(run, body_started=True, safe_point=True)
            return
        except Exception as exc:
            if run.claim_report():
                # The spans the body recorded up to the failure go with it (Koala stores them
                # under the attempt's span, as on complete).
                self._fail(run, **failure_payload(exc), spans=ctx.spans.wire())
            return
        if not run.claim_report():
            return  # released at the shutdown deadline, or lost: the outcome is not ours to report
        problem = _jsonable(output) or _jsonable(ctx.state_delta)
        if problem:
            self._fail(run, classification="fatal", error_class="TypeError", message=f"the output is not JSON: {problem}")
            return
        try:
            self.persist(
                lambda: self.client.complete(
                    self.worker_id,
                    lease,
                    output=output,
                    state_delta=ctx.state_delta,
                    usage=ctx.wire_usage(),
                    spans=ctx.spans.wire(),
                    duration_seconds=time.monotonic() - began,
                ),
                run,
            )
        except AlreadyRecorded:
            pass
        except Rejected as exc:
            log.info("koala: lease %s of job %s: %s; dropped", lease.lease_id, lease.job_id, exc.reason.value)
        except ApiError as exc:
            if exc.status in (400, 413):
                # The completion itself was refused (too large, a wrong field): say so, once.
                self._fail(run, classification="fatal", error_class="CompletionRefused", message=exc.message[:MAX_MESSAGE_CHARS])
            else:
                log.error("koala: lease %s of job %s: completion refused: %s", lease.lease_id, lease.job_id, exc)

    # -- heartbeats ----------------------------------------------------------------------------

    def _beat(self, run: LeaseRun) -> None:
        pending = run.ctx.take_progress()
        try:
            answer = self.client.heartbeat(self.worker_id, run.lease, progress=pending)
        except Rejected as exc:
            log.info("koala: lease %s of job %s: %s; stopping the body", run.lease.lease_id, run.lease.job_id, exc.reason.value)
            run.reject(exc.reason.value)
            return
        except ApiError as exc:
            if pending is not None:
                run.ctx.restore_progress(pending)
            if exc.status == 404:
                run.reject("unknown_lease")
                return
            # Transient: try again soon, well inside the lease.
            run.next_beat = time.monotonic() + min(1.0, run.lease.heartbeat_seconds / 4)
            log.warning("koala: heartbeat for lease %s: %s", run.lease.lease_id, exc)
            return
        run.next_beat = time.monotonic() + run.lease.heartbeat_seconds
        if answer.cancel:
            run.request_stop()

    def _beat_progress(self, run: LeaseRun) -> None:
        """Store a checkpoint the body left before it stops at a safe point (a retry resumes from it)."""
        pending = run.ctx.take_progress()
        if pending is None:
            return
        try:
            self.client.heartbeat(self.worker_id, run.lease, progress=pending)
        except ApiError as exc:
            log.warning("koala: last checkpoint of lease %s not stored: %s", run.lease.lease_id, exc)

    def _heartbeats(self) -> None:
        while not self._done.is_set():
            now = time.monotonic()
            with self._cond:
                running = [run for run in self._held.values() if run.started and not run.finished and run.rejection is None]
            for run in running:
                if run.next_beat <= now:
                    self._beat(run)
            nearest = min((run.next_beat for run in running), default=now + BEAT_TICK_SECONDS)
            self._beat_wake.wait(max(0.05, min(BEAT_TICK_SECONDS, nearest - time.monotonic())))
            self._beat_wake.clear()

    # -- the loop ------------------------------------------------------------------------------

    def stop(self, reason: str = "stop()") -> None:
        """Stop acquiring, ask running bodies to stop, give back what is still held at the deadline.

        Safe from a signal handler: it only sets an event; the worker's own threads do the rest
        (the stop call ends the open long-poll at once, so an idle worker returns in well under a
        second; a busy one as soon as its bodies finish, or at the deadline).
        """
        self._stop_reason = self._stop_reason or reason
        self._stopping.set()

    def _supervise(self) -> None:
        """At a stop: tell Koala (which answers the open long-poll at once, handing out nothing
        more), tell running bodies, and cut a long-poll still open at the deadline (a server
        without the stop call)."""
        self._stopping.wait()
        if self._done.is_set():
            return
        self._deadline = time.monotonic() + self.shutdown_deadline
        with self._cond:
            running = list(self._held.values())
            self._cond.notify_all()
        for run in running:
            run.request_stop()
        self._announce_stop()
        # The acquire open now is answered by Koala (204, or the leases it had already granted,
        # which an at_most_once kind must not lose): it is cut only at the deadline.
        if not self._done.wait(self.shutdown_deadline) and self._serve_thread is not None:
            self.client.abort(self._serve_thread)

    def _announce_stop(self) -> bool:
        """The stop call: True once Koala has recorded this worker's exit (it holds no lease)."""
        if not self.worker_id:
            return False
        try:
            answer = self.client.stop(self.worker_id, reason=self._stop_reason)
        except ApiError as exc:
            log.warning("koala: stop call for %s: %s", self.worker_id, exc)
            return False
        return answer.exited

    def held(self) -> int:
        with self._cond:
            return len(self._held)

    def serve(self) -> None:
        """Block until ``stop()`` (or SIGTERM, when called in the main thread)."""
        self._serve_thread = threading.get_ident()
        previous: Any = None
        in_main = threading.current_thread() is threading.main_thread()
        if in_main:
            previous = signal.signal(signal.SIGTERM, lambda signum, frame: self.stop("SIGTERM"))
        try:
            self._register()
            threads = [threading.Thread(target=self._pool, name=f"koala-body-{i}", daemon=True) for i in range(self.concurrency)]
            threads.append(threading.Thread(target=self._heartbeats, name="koala-heartbeat", daemon=True))
            threads.append(threading.Thread(target=self._supervise, name="koala-stop", daemon=True))
            for thread in threads:
                thread.start()
            try:
                self._acquire_loop()
            except KeyboardInterrupt:
                self.stop("KeyboardInterrupt")
            self._shut_down()
        finally:
            self._done.set()
            self._stopping.set()  # ends the supervisor
            self._beat_wake.set()
            for _ in range(self.concurrency):
                self._work.put(None)
            if in_main:
                signal.signal(signal.SIGTERM, previous)

    def _acquire_loop(self) -> None:
        failures = 0
        limit = self.concurrency
        while not self._stopping.is_set():
            assert self.registration is not None
            limit = min(self.concurrency, self.registration.concurrency)
            with self._cond:
                while len(self._held) >= limit and not self._stopping.is_set():
                    self._cond.wait()
                free = limit - len(self._held)
            if self._stopping.is_set():
                return
            try:
                leases = self.client.acquire(self.worker_id, max=free, wait_seconds=self.registration.poll_seconds)
            except ApiError as exc:
                if self._stopping.is_set():
                    return
                if exc.status == 404:
                    log.warning("koala: Koala does not know worker %s any more; registering again", self.worker_id)
                    self._register()
                    continue
                failures += 1
                if exc.status == 429 and exc.retry_after is not None:
                    delay = exc.retry_after
                else:
                    delay = backoff_delay(failures)
                log.warning("koala: acquire: %s; trying again in %.1fs", exc, delay)
                self._wait(delay)
                continue
            failures = 0
            for lease in leases:
                run = LeaseRun(self, lease)
                with self._cond:
                    self._held[lease.lease_id] = run
                self._work.put(run)
            if leases:
                self._beat_wake.set()

    def _shut_down(self) -> None:
        self._stopping.set()
        if self._deadline is None:  # a KeyboardInterrupt: the supervisor may not have run yet
            self._deadline = time.monotonic() + self.shutdown_deadline
        with self._cond:
            running = list(self._held.values())
        for run in running:
            run.request_stop()  # including leases the last acquire brought in
        with self._cond:
            while self._held and time.monotonic() < self._deadline:
                self._cond.wait(max(0.0, self._deadline - time.monotonic()))
            left = list(self._held.values())
        for run in left:
            # Still running at the deadline: give the lease back; whatever the body does now is not reported.
            if run.claim_report():
                self._release(run, body_started=run.started, safe_point=False)
        # Every lease is reported or given back: the stop call now records the exit.
        exited = self._announce_stop()
        log.info(
            "koala: worker %s stopped (%d lease(s) given back at the deadline; exit %s)",
            self.worker_id,
            len(left),
            "recorded" if exited else "not recorded",
        )
