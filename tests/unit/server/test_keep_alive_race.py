"""A kept-alive connection whose timeout comes due with its next request already waiting unread is not closed
(uvloop runs due timers before it reads sockets); one with nothing waiting is."""

from __future__ import annotations

import socket

from infer.server.http_protocol import LimitedProtocol


class _Transport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.closed = sock, False

    def get_extra_info(self, name: str) -> socket.socket | None:
        return self.sock if name == "socket" else None

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def _timed_out(server_end: socket.socket) -> bool:
    """Run the keep-alive timeout on a connection over `server_end`; whether it closed the connection."""
    protocol = LimitedProtocol.__new__(LimitedProtocol)  # only the transport matters here
    protocol.transport = _Transport(server_end)
    protocol.timeout_keep_alive_handler()
    return protocol.transport.closed


def test_a_request_waiting_unread_keeps_the_connection_and_stays_unread() -> None:
    server_end, client = socket.socketpair()
    with server_end, client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        assert not _timed_out(server_end)
        server_end.setblocking(False)
        assert server_end.recv(64).startswith(b"POST /v1/completions")  # peeked, not taken: the parser reads it all


def test_an_idle_connection_is_closed() -> None:
    server_end, client = socket.socketpair()
    with server_end, client:
        assert _timed_out(server_end)


def test_a_connection_the_client_closed_is_closed() -> None:
    server_end, client = socket.socketpair()
    with server_end:
        client.close()
        assert _timed_out(server_end)
