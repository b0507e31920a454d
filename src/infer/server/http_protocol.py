"""uvicorn's h11 protocol with a deadline on request headers (`--header-timeout-s`).

uvicorn times out idle keep-alive connections but never a client that opens a connection and sends nothing, or
sends its request line and headers a byte at a time: each holds a connection (and a file descriptor) for as long
as it likes. Here a connection whose request headers are not complete within the deadline (counted from its
opening, or from the first byte of a next request on a kept-alive connection) is closed.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("infer.server")


class HeaderTimeoutH11Protocol(H11Protocol):
    """H11Protocol that closes connections whose request headers take longer than `header_timeout_s`."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:
            if self._header_timer is None:  # the first bytes of a next request on a kept-alive connection
                self._arm_header_timer()
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closed a connection whose request headers took over %g s (--header-timeout-s)",
                     self.header_timeout_s)
            self.transport.close()


def with_header_timeout(timeout_s: float) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class for uvicorn.Config(http=...) with this deadline."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout_s": timeout_s})
