"""uvicorn's httptools protocol with a deadline on request headers (`--header-timeout-s`) and a cap on open
connections (`--max-connections`).

httptools (llhttp, in C) rather than uvicorn's pure-Python h11: a streamed token costs one body write, and h11's
state machine per write was about a fifth of the API server's CPU per token (benchmarks/reports/api_server_cost_cpu.md).

uvicorn times out idle keep-alive connections but never a client that opens a connection and sends nothing, or
sends its request line and headers a byte at a time: each holds a connection (and a file descriptor) for as long
as it likes. Here a connection whose request headers are not complete within the deadline (counted from its
opening, or from the first byte of a next request on a kept-alive connection) is closed.

An idle keep-alive connection whose timeout comes due while its next request already waits unread is kept: uvloop
runs a due timer before it reads the sockets, so on a busy server a client reusing its connection near the timeout
would otherwise see it closed under its request.

Past the cap, a new connection takes the place of the oldest one that has not delivered a whole request (still in
its headers or body, or idle between requests): clients that trickle bytes can hold the server's connections only
until someone else needs one, and file descriptors never run out. When every open connection is serving a
request, the new one is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import OrderedDict

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("infer.server")

REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s")
REFUSED_BODY = (b'{"error": {"message": "this API server has --max-connections connections open, all serving '
                b'requests; retry later", "type": "service_unavailable", "param": null, "code": 503}}')
EVICTION_TRIES = 64  # serving connections skipped at the front of the queue before a new one is refused


class LimitedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes connections whose request headers take longer than `header_timeout_s` and
    keeps at most `max_connections` open (each subclass made by `limited_protocol` has its own set)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1 << 30
    opened: OrderedDict[LimitedProtocol, None]  # open connections, oldest first

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_headers = True  # from the first byte of a request (or the connection's opening) to its last header
        opened = type(self).opened
        if len(opened) >= self.max_connections and not self._evict(opened):
            log.warning("refused a connection: %d open, all serving requests (--max-connections)", len(opened))
            transport.write(REFUSED % (len(REFUSED_BODY), REFUSED_BODY))
            transport.close()
            return
        opened[self] = None
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        if self._header_timer is None:  # the first bytes of a next request on a kept-alive connection
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        type(self).opened.pop(self, None)
        super().connection_lost(exc)

    @property
    def _receiving(self) -> bool:
        """Whether this connection has no whole request to serve: idle, in its headers, or in its body."""
        cycle = self.cycle
        serving = cycle is not None and not cycle.response_complete
        return not serving or cycle.more_body

    def _evict(self, opened: OrderedDict[LimitedProtocol, None]) -> bool:
        """Close the oldest connection that is not serving a request; False when none of the first few is such."""
        for _ in range(min(EVICTION_TRIES, len(opened))):
            oldest = next(iter(opened))
            if oldest._receiving:
                opened.pop(oldest)
                log.info("closed the oldest connection still receiving its request to open a new one "
                         "(--max-connections %d)", self.max_connections)
                oldest.transport.close()
                return True
            opened.move_to_end(oldest)
        return False

    def timeout_keep_alive_handler(self) -> None:
        if not self._request_waiting():
            super().timeout_keep_alive_handler()

    def _request_waiting(self) -> bool:
        """Whether bytes the event loop has not read yet wait on this connection's socket (peeked, not taken)."""
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as peek:
                return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # nothing waiting (EAGAIN), or the socket is gone
            return False

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self._in_headers and not self.transport.is_closing():
            log.info("closed a connection whose request headers took over %g s (--header-timeout-s)",
                     self.header_timeout_s)
            self.transport.close()


def limited_protocol(header_timeout_s: float, max_connections: int) -> type[LimitedProtocol]:
    """The protocol class for uvicorn.Config(http=...) with these limits."""
    return type("LimitedProtocol", (LimitedProtocol,), {
        "header_timeout_s": header_timeout_s, "max_connections": max_connections, "opened": OrderedDict()})
