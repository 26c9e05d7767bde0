"""A TCP proxy on 127.0.0.1 that partitions one process from PostgreSQL or Redis on command.

A network partition rarely closes sockets: packets stop, both ends keep their connections
open and wait. That is the case the engine must survive (a stale transaction holding locks,
a reply that never arrives), and killing a process or a server cannot produce it. Point one
worker's ``DATABASE_URL`` (or ``REDIS_URL``) at a ``FaultProxy`` and keep everyone else on
direct connections; then::

    proxy.blackhole()                      # stop forwarding both ways; sockets stay open
    proxy.heal()                           # forward again, nothing lost (like TCP after a stall)
    proxy.delay(0.2)                       # add latency to every chunk
    proxy.cut()                            # reset every connection (RST), like a dead link
    proxy.blackhole_after(b"INSERT INTO workers_operation")  # forward the chunk that holds it, then stall
    proxy.hold_on(b"SET state = 'succeeded'")                 # stall *before* forwarding that chunk
    proxy.blackhole_after(b"run_state = run_state ||", b"COMMIT")  # the first pattern, then the next COMMIT

Blackholed bytes are held, not dropped: on ``heal()`` the held chunk and everything the
kernels buffered meanwhile flow on, as they would after a healed link. Pattern triggers see
the client's bytes as sent, so the PostgreSQL URL must say ``sslmode=disable``.

The upstream is a ``(host, port)`` pair or a unix socket path (the embedded PostgreSQL).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass


@dataclass
class _Trigger:
    pattern: bytes
    before: bool  # True: stall before forwarding the chunk; False: forward it, then stall
    fired: threading.Event
    then: tuple[bytes, ...] = ()  # patterns still to see, in order, before this trigger fires


class FaultProxy:
    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Condition()
        self._blackholed = False
        self._delay = 0.0
        self._trigger: _Trigger | None = None
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self.connections = 0  # accepted so far (a test can wait for a worker to connect)
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)

    # -- control ----------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    @property
    def blackholed(self) -> bool:
        with self._lock:
            return self._blackholed

    def blackhole(self) -> None:
        with self._lock:
            self._blackholed = True

    def heal(self) -> None:
        with self._lock:
            self._blackholed = False
            self._trigger = None
            self._lock.notify_all()

    def delay(self, seconds: float) -> None:
        with self._lock:
            self._delay = max(0.0, seconds)

    def blackhole_after(self, pattern: bytes, *then: bytes) -> threading.Event:
        """Forward the next client chunk containing ``pattern``, then stall everything. With
        ``then``, each later pattern must be seen in turn first (e.g. a statement, then the COMMIT
        of its transaction): the stall follows the chunk holding the last."""
        fired = self._arm(pattern, before=False)
        with self._lock:
            assert self._trigger is not None
            self._trigger.then = then
        return fired

    def hold_on(self, pattern: bytes) -> threading.Event:
        """Stall everything as soon as a client chunk contains ``pattern``, holding that chunk."""
        return self._arm(pattern, before=True)

    def _arm(self, pattern: bytes, *, before: bool) -> threading.Event:
        fired = threading.Event()
        with self._lock:
            self._trigger = _Trigger(pattern, before, fired)
        return fired

    def cut(self) -> None:
        """Reset every open connection (SO_LINGER 0 sends RST); new connections still work."""
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._blackholed = False
            self._lock.notify_all()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    # -- plumbing ---------------------------------------------------------------------------
    def _connect_upstream(self) -> socket.socket:
        if isinstance(self.upstream, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(self.upstream)
        else:
            sock = socket.create_connection(self.upstream)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                server = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _wait_open(self) -> bool:
        """Block while blackholed; False once the proxy is closed."""
        with self._lock:
            while self._blackholed and not self._closed:
                self._lock.wait(0.1)
            return not self._closed

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                if not self._wait_open():
                    return
                data = src.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                forward_then_stall = False
                if from_client:
                    with self._lock:
                        trigger, fire = self._trigger, False
                        if trigger is not None and trigger.pattern in data:
                            after = data[data.index(trigger.pattern) + len(trigger.pattern) :]
                            while trigger.then and trigger.then[0] in after:  # the next ones in the same chunk
                                after = after[after.index(trigger.then[0]) + len(trigger.then[0]) :]
                                trigger.then = trigger.then[1:]
                            self._trigger = None
                            if trigger.then:
                                self._trigger = _Trigger(trigger.then[0], trigger.before, trigger.fired, trigger.then[1:])
                            else:
                                trigger.fired.set()
                                fire = True
                        if fire and trigger is not None:
                            if trigger.before:
                                self._blackholed = True  # this chunk waits for heal() below
                            else:
                                forward_then_stall = True
                # A chunk read just before a blackhole began waits here: held, not dropped.
                if not self._wait_open():
                    return
                with self._lock:
                    delay = self._delay
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
                if forward_then_stall:
                    with self._lock:
                        self._blackholed = True
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._sockets.discard(src)
                self._sockets.discard(dst)
