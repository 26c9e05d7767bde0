"""The long-poll hub: one poller per server process serves every waiting acquire.

Waiting costs one open request per idle worker and nothing else:

- A waiting acquire is a future in ``Hub.waiters``; no request polls the database by itself.
- The hub looks for work when the Redis doorbell rings (``workers.doorbell.channel("doorbell")``: enqueue,
  the dispatcher re-ringing due retries and unparked jobs, a passed-on doorbell), when a worker
  whose last look found work asks again, and otherwise once every ``KOALA_API_POLL_SECONDS``
  (default 1 s, at least 0.5 s: never more than twice a second) — for all waiters at once.
- An idle look is one index probe (``protocol.any_due``) whatever the number of waiters; a worker
  that asks again while nothing has rung since its signature's last empty look waits for the
  next ring or tick instead of costing a query.
- Claims run in the hub's thread pool (persistent database connections, bounded in number);
  the event loop only moves futures.
- Presence (``last_seen_at``) of the waiting workers is written in one UPDATE every 10 s.

A lease claimed for a request that ended meanwhile (timeout, disconnect, the worker's stop call)
is given back at once (``protocol.give_back``, no attempt used).

A worker's stop call (``stop_waiting``) answers its waiting acquire at once with nothing, in this
process and, through the ``worker-stop`` channel, in every other server process: an idle worker
stops in well under a second instead of waiting out its long-poll.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from api import http, protocol
from api.protocol import ClaimPass, Registration
from workers import dbsession, doorbell
from workers.services.leases import Lease, WorkerFull

log = logging.getLogger("koala.api")
T = TypeVar("T")
PRESENCE_SECONDS = 10.0
PASS_SECONDS = 1.0  # how long one round's view of pauses and budget gating is reused


class OverConcurrency(Exception):
    """The worker already holds as many leases as its concurrency allows."""

    def __init__(self, held: int) -> None:
        super().__init__(held)
        self.held = held


@dataclass(eq=False)
class _Waiter:
    registration: Registration
    count: int
    future: asyncio.Future[list[Lease]]
    since: float = field(default_factory=time.monotonic)


def _in_thread[T](fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    # A pool thread keeps its database connection between calls: the worker API's calls are many
    # and small, and reconnecting (with the session settings workers/dbsession.py applies) would
    # cost more queries than the calls themselves. A connection that failed is dropped before the
    # next call, as Django does between requests.
    if connection.connection is not None and connection.errors_occurred:
        connection.close_if_unusable_or_obsolete()
    try:
        return fn(*args, **kwargs)
    except (OperationalError, InterfaceError):
        connection.close()
        raise


class Hub:
    def __init__(self) -> None:
        self.waiters: list[_Waiter] = []
        threads = int(getattr(settings, "KOALA_API_DB_THREADS", 16))
        # Every database call of a worker's call runs in these threads, whose sessions are bounded
        # like an RQ worker's (workers/dbsession.py): a partition mid-transaction cannot hold a
        # job row (or any lock) past the bounds, so a replacement is never blocked behind it.
        self.executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="koala-api-db", initializer=dbsession.bound_this_thread
        )
        self.threads = threads
        # Calls handed to the pool and not finished (running or queued): the event loop alone
        # changes it, so no lock. Requests beyond threads + KOALA_API_MAX_QUEUED_CALLS are refused
        # (``call``) rather than queued without bound; the hub's own work is never refused.
        self.pending = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._listener: threading.Thread | None = None
        self._stopping = threading.Event()
        # Signatures whose last look found nothing, cleared by every ring and tick.
        self._empty: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        self._seen: set[str] = set()
        self._last_presence = time.monotonic()
        self._pass: tuple[float, ClaimPass] | None = None
        self.rings = 0

    # -- the executor: every database call of the API goes through it ----------------------------
    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self._ensure_started()  # the first API call: start the poller and the Redis listener
        context = contextvars.copy_context()  # the request's redaction context follows the call
        call = functools.partial(context.run, _in_thread, fn, *args, **kwargs)
        self.pending += 1
        try:
            return await loop.run_in_executor(self.executor, call)
        finally:
            self.pending -= 1

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A request's call into the pool (``run``), refused with 503 busy when every thread is
        taken and KOALA_API_MAX_QUEUED_CALLS calls already wait for one."""
        queued = int(getattr(settings, "KOALA_API_MAX_QUEUED_CALLS", 1000))
        if self.pending >= self.threads + queued:
            raise http.busy(f"{self.pending} calls hold or wait for its {self.threads} database threads")
        return await self.run(fn, *args, **kwargs)

    # -- acquire ---------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is loop and self._task is not None and not self._task.done():
            return
        self.loop = loop
        self._wake = asyncio.Event()
        self._task = loop.create_task(self._serve(), name="koala-api-poller")
        if self._listener is None or not self._listener.is_alive():
            self._listener = threading.Thread(target=self._listen, name="koala-api-doorbell", daemon=True)
            self._listener.start()

    async def acquire(self, registration: Registration, *, count: int, wait: float) -> list[Lease]:
        """Up to ``count`` leases for ``registration``, or [] after ``wait`` seconds (at once for a
        worker that has called stop)."""
        self._ensure_started()
        assert self.loop is not None and self._wake is not None
        if registration.stopping or protocol.is_stopping(registration.worker_id):
            return []
        self._seen.add(registration.worker_id)
        waiter = _Waiter(registration=registration, count=count, future=self.loop.create_future())
        if wait <= 0:
            # "Is there work now?" without waiting: one claim for this worker alone.
            results, _ = await self.run(self._claim_round, [waiter])
            for _, got in results:
                if isinstance(got, OverConcurrency):
                    raise got
                return got
            return []
        limit = int(getattr(settings, "KOALA_API_MAX_WAITING", 1000))
        if len(self.waiters) >= limit:
            # Each waiting acquire is an open request: past the bound the worker comes back later
            # (a few seconds: the waiting ones are answered within their wait).
            raise http.busy(f"{len(self.waiters)} acquires are waiting here (KOALA_API_MAX_WAITING)", retry_after=5)
        self.waiters.append(waiter)
        if registration.signature not in self._empty:
            self._wake.set()  # its last look found work (or it is new): look now
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout=wait)
        except TimeoutError:
            return []
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)
            if not waiter.future.done():
                waiter.future.cancel()

    def seen(self, worker_id: str) -> None:
        self._seen.add(worker_id)

    def stop_waiting(self, worker_id: str) -> int:
        """On the event loop: answer ``worker_id``'s waiting acquires with nothing, now. A claim
        already running for them finds the request ended and gives its leases back."""
        protocol.mark_stopping(worker_id)
        ended = 0
        for waiter in list(self.waiters):
            if waiter.registration.worker_id == worker_id and not waiter.future.done():
                waiter.future.set_result([])
                ended += 1
        return ended

    def started(self, worker_id: str) -> None:
        """On the event loop: ``worker_id`` registered (again): its acquires wait as usual, with
        what it serves now read again from its row (it may have registered through another process)."""
        protocol.forget_stopping(worker_id)
        protocol.forget_registration(worker_id)

    def announce(self, event: str, worker_id: str) -> None:
        """Tell every server process (this one too) that ``worker_id`` stops or starts (``event``):
        its acquire may wait in any of them, and a name that stopped may register again through
        another. One channel, so every process sees a stop and a later start in that order. A Redis
        that is away only costs the other processes' long-polls their wait."""
        handler = self.stop_waiting if event == "stop" else self.started
        if self.loop is not None:
            self.loop.call_soon_threadsafe(handler, worker_id)
        else:
            handler(worker_id)
        try:
            doorbell.redis_connection().publish(doorbell.channel("worker-stop"), f"{event}:{worker_id}")
        except Exception as exc:
            log.warning("worker API: could not announce the %s of %s (%s)", event, worker_id, type(exc).__name__)

    # -- the poller --------------------------------------------------------------------------------
    def _tick_seconds(self) -> float:
        return max(float(getattr(settings, "KOALA_API_POLL_SECONDS", 1.0)), 0.5)

    async def _serve(self) -> None:
        assert self._wake is not None
        while not self._stopping.is_set():
            rang = False
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._tick_seconds())
                rang = True
            except TimeoutError:
                self._empty.clear()  # a tick: time-based work (retries, delays) may have come due
            self._wake.clear()
            try:
                await self._round(rang=rang)
                await self._presence()
            except Exception:
                # Never let the poller die: the database may be away; the next tick tries again.
                log.exception("worker API poller round failed")
                await asyncio.sleep(self._tick_seconds())

    async def _round(self, *, rang: bool) -> None:
        waiting = [w for w in self.waiters if not w.future.done()]
        if not waiting:
            return
        # A ring during this round may announce work our claims ran too early to see: then what
        # this round found empty is not recorded as empty (the ring's wake looks again).
        rings = self.rings
        if rang:
            waiting = [w for w in waiting if w.registration.signature not in self._empty]
        else:
            queues = sorted({q for w in waiting for q in w.registration.queues})
            if not await self.run(protocol.any_due, queues=queues):
                if self.rings == rings:
                    self._empty.update(w.registration.signature for w in waiting)
                return
        if not waiting:
            return
        results, empty = await self.run(self._claim_round, waiting)
        if self.rings == rings:
            self._empty.update(empty)
        for waiter, got in results:
            if isinstance(got, OverConcurrency):
                if not waiter.future.done():
                    waiter.future.set_exception(got)
                continue
            if waiter.future.done():
                # The request ended while we claimed for it: give the leases back, no attempt used.
                await self.run(protocol.give_back, leases_=got)
                continue
            waiter.future.set_result(got)

    def _claim_pass(self) -> ClaimPass:
        now = time.monotonic()
        if self._pass is None or now - self._pass[0] > PASS_SECONDS:
            self._pass = (now, protocol.claim_pass())
        return self._pass[1]

    def _claim_round(
        self, waiting: list[_Waiter]
    ) -> tuple[list[tuple[_Waiter, list[Lease] | OverConcurrency]], set[tuple[tuple[str, ...], tuple[str, ...]]]]:
        """In a pool thread: claim for the waiters in arrival order; one empty claim per signature.
        Returns what each waiter got and the signatures found empty (the loop records them)."""
        state = self._claim_pass()
        results: list[tuple[_Waiter, list[Lease] | OverConcurrency]] = []
        empty: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        for waiter in waiting:
            registration = waiter.registration
            if registration.signature in empty:
                continue
            # The claim decides from the worker's row, locked for its transaction: its kinds, a
            # stop, and its concurrency against the leases it holds now, whichever server process
            # claimed them (leases.claim_for_worker). Only waiters whose signature may have work
            # pay for it; an idle round stops at the first empty claim of each signature.
            got = protocol.claim_for(registration, count=waiter.count, state=state)
            if isinstance(got, WorkerFull):
                results.append((waiter, OverConcurrency(got.held)))
                continue
            if got is None:  # stopped or asked to stop meanwhile (through any server process)
                results.append((waiter, []))
                continue
            if got:
                results.append((waiter, got))
            else:
                empty.add(registration.signature)
        return results, empty

    async def _presence(self) -> None:
        if time.monotonic() - self._last_presence < PRESENCE_SECONDS:
            return
        self._last_presence = time.monotonic()
        seen = {w.registration.worker_id for w in self.waiters} | self._seen
        self._seen = set()
        if seen:
            await self.run(protocol.touch_workers, worker_ids=sorted(seen))

    # -- the doorbell ------------------------------------------------------------------------------
    def _rang(self) -> None:
        self.rings += 1
        self._empty.clear()
        if self._wake is not None:
            self._wake.set()

    def _listen(self) -> None:
        """A thread: subscribe to the doorbell (and key revocations); reconnect with backoff."""
        from api import keys
        from koala import redis_client

        delay = 0.5
        while not self._stopping.is_set():
            try:
                # get_message waits with its own timeout and reads only what has arrived; the
                # socket timeout ends the 30 s health check's PING to a frozen master.
                client = redis_client.connect()
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                rings, revoked, stops = doorbell.channel("doorbell"), keys.revoked_channel(), doorbell.channel("worker-stop")
                pubsub.subscribe(rings, revoked, stops)
                delay = 0.5
                # A reconnect may have missed rings: look once.
                if self.loop is not None:
                    self.loop.call_soon_threadsafe(self._rang)
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    channel = message["channel"].decode() if isinstance(message["channel"], bytes) else message["channel"]
                    data = message["data"]
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    if channel == revoked:
                        keys.forget_cached(text)
                    elif channel == stops:
                        event, _, worker_id = text.partition(":")
                        if self.loop is not None:
                            self.loop.call_soon_threadsafe(self.stop_waiting if event == "stop" else self.started, worker_id)
                    elif self.loop is not None:
                        self.loop.call_soon_threadsafe(self._rang)
            except Exception as exc:  # Redis away: the tick keeps serving; try again later
                log.warning("worker API doorbell subscription lost (%s); retrying in %.1f s", type(exc).__name__, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, 10.0)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub()
        return _hub
