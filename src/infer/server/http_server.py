"""The uvicorn server of one API server process: its timeouts, and a stop with a deadline.

SIGTERM (or Ctrl-C) stops accepting connections and lets the requests in flight finish for `--shutdown-timeout-s`;
whatever still runs then is aborted (streams end with finish_reason "abort", non-streamed requests answer with
what they have) and the process exits 0. A second signal exits at once. uvicorn's own handling re-raises the
signal after its shutdown (exit status 143) and ignores a second SIGTERM; this server does neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Generator
from types import FrameType
from typing import Any

import uvicorn

from infer.frontend.client import EngineClient
from infer.server.http_protocol import limited_protocol
from infer.server.limits import ServerLimits

log = logging.getLogger("infer.server")

ABORT_GRACE_S = 5.0  # after the deadline's aborts: the streams' last chunks go out before uvicorn cancels anything


def uvicorn_config(app: Any, limits: ServerLimits, log_level: str, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's settings for an API server: header, keep-alive and shutdown timeouts from `limits`; uvloop's event
    loop and httptools' parser (a streamed token costs ~25% less CPU than on asyncio's loop and h11)."""
    return uvicorn.Config(app, log_level=log_level, loop="uvloop",
                          http=limited_protocol(limits.header_timeout_s, limits.connection_cap()),
                          timeout_keep_alive=limits.keep_alive_timeout_s,
                          timeout_graceful_shutdown=limits.shutdown_timeout_s + ABORT_GRACE_S, **kwargs)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose stop drains within a deadline, then aborts the engine requests still running."""

    def __init__(self, config: uvicorn.Config, limits: ServerLimits, engine: EngineClient) -> None:
        super().__init__(config)
        self.limits = limits
        self.engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        self.aborted_at_deadline = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(RateLimitedErrors().handle)
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            log.warning("second %s: exiting now", signal.Signals(sig).name)
            self.force_exit = True
            # the requests and the lifespan task still running are cancelled as the loop closes: expected, not errors
            logging.getLogger("uvicorn.error").addFilter(_not_cancelled)
            return
        self.should_exit = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._start_deadline, signal.Signals(sig).name)

    def _start_deadline(self, name: str) -> None:
        live = self.engine.num_live
        if live:
            log.info("%s: draining %d request(s) for up to %g s (--shutdown-timeout-s); a second signal exits now",
                     name, live, self.limits.shutdown_timeout_s)
        assert self._loop is not None
        self._loop.call_later(self.limits.shutdown_timeout_s, self._abort_left)

    def _abort_left(self) -> None:
        self.aborted_at_deadline = self.engine.abort_all()
        if self.aborted_at_deadline:
            log.warning("aborted %d request(s) still running at the --shutdown-timeout-s deadline (%g s)",
                        self.aborted_at_deadline, self.limits.shutdown_timeout_s)


def _not_cancelled(record: logging.LogRecord) -> bool:
    """Whether a log record is about something other than a task cancelled by the exit (a request's, as an
    exception; the lifespan's, as the traceback text starlette reports)."""
    if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
        return False
    text = record.getMessage()
    return not (text.startswith("Traceback") and text.rstrip().endswith("CancelledError"))


class RateLimitedErrors:
    """The event loop's exception handler: each kind of error (its message) logged at most once per interval with
    the count since, so a flood (accept() failing for want of file descriptors, thousands a second) costs one line."""

    interval_s = 10.0

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def handle(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        key = str(context.get("message", ""))
        now = time.monotonic()
        if now - self._last.get(key, -self.interval_s) < self.interval_s:
            self._since[key] = self._since.get(key, 0) + 1
            return
        repeated = self._since.pop(key, 0)
        self._last[key] = now
        if repeated:
            context = {**context, "message": f"{key} (and {repeated} more in the last {self.interval_s:g} s)"}
        loop.default_exception_handler(context)
