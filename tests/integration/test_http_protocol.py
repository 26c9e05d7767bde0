"""koala/http_protocol.py: the HTTP protocol uvicorn serves Koala with turns Nagle's algorithm off
on every connection, also on a listening socket uvicorn bound itself (``--workers N``), where
uvicorn's own protocol leaves it on (each keep-alive call then waits ~40 ms for a delayed ACK).
Loopback sockets: an integration test."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.auto import AutoHTTPProtocol
from uvicorn.server import ServerState

from devtools.servers import HTTP_PROTOCOL, uvicorn_command
from koala.http_protocol import HttpProtocol


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # never called: no request is sent
    raise AssertionError("no request expected")


def _nodelay_of_accepted_connection(protocol_class: type[Any]) -> int:
    """TCP_NODELAY of the server side of one connection accepted on a socket bound as uvicorn's
    supervisor binds it (``socket.socket(family=AF_INET)``: protocol number 0)."""
    config = Config(app=_app, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    made: list[Any] = []

    def factory() -> Any:
        protocol = protocol_class(config=config, server_state=state, app_state={})
        made.append(protocol)
        return protocol

    async def run() -> int:
        listener = socket.socket(family=socket.AF_INET)
        listener.bind(("127.0.0.1", 0))
        assert listener.proto == 0  # what uvicorn's bind_socket makes
        server = await asyncio.get_running_loop().create_server(factory, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if made and made[0].transport is not None:
                break
            await asyncio.sleep(0.01)
        value = int(made[0].transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()
        server.close()
        await server.wait_closed()
        return value

    return asyncio.run(run())


def test_uvicorns_own_protocol_leaves_nagle_on_for_a_socket_it_bound() -> None:
    # The control: what this module works around (if uvicorn fixes it, this fails and the
    # override can go).
    assert _nodelay_of_accepted_connection(AutoHTTPProtocol) == 0


def test_koalas_protocol_sets_tcp_nodelay_on_every_connection() -> None:
    assert _nodelay_of_accepted_connection(HttpProtocol) != 0


@pytest.mark.parametrize("workers", [None, 2])
def test_every_uvicorn_command_serves_koalas_protocol(workers: int | None) -> None:
    command = uvicorn_command(host="127.0.0.1", port=8000, workers=workers)
    assert command[command.index("--http") + 1] == HTTP_PROTOCOL == "koala.http_protocol:HttpProtocol"
