"""The API server's listening socket: the connections asyncio serves from it have Nagle's algorithm off, so a
response's body never waits for the client's delayed ACK of its headers (~40 ms per keep-alive request)."""

from __future__ import annotations

import asyncio
import socket

from infer.server.launch import _bind


def test_served_connections_have_tcp_nodelay():
    async def main() -> int:
        sock = _bind("127.0.0.1", 0, reuse_port=True)
        nodelay: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                conn = transport.get_extra_info("socket")
                nodelay.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
            try:
                return await asyncio.wait_for(nodelay, 10)
            finally:
                writer.close()

    assert asyncio.run(main()) != 0
