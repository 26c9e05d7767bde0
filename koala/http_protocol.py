"""The HTTP protocol uvicorn serves Koala with: uvicorn's own, with TCP_NODELAY on every connection.

Why: with ``--workers N`` (deploy/systemd/koala-web.service runs two) uvicorn binds the listening
socket itself, with the protocol number left at 0; accepted connections inherit it, and asyncio
turns Nagle's algorithm off (TCP_NODELAY) only for sockets that say IPPROTO_TCP. uvicorn writes a
response's head and body separately, so with Nagle on the body waits for the client's delayed
ACK of the head: about 40 ms on every keep-alive call after the first (measured: a sequential
``POST /api/v1/jobs`` 60 ms per call with two processes, 14 ms with one; bench/http_start.py).
Setting the option on each accepted connection makes both cases the same. A single-process
server (``make run``) already had it; setting it again changes nothing.

uvicorn loads this class by its dotted path (``--http koala.http_protocol:HttpProtocol``,
devtools/servers.py); it is uvicorn's ``auto`` choice (httptools when installed, else h11).
"""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.auto import AutoHTTPProtocol


# AutoHTTPProtocol is a variable (httptools' or h11's class): mypy cannot check it as a base.
class HttpProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # the peer already left: uvicorn's own handling follows
                pass
        super().connection_made(transport)
