"""The API server's event-loop exception handler logs a flood of one error (accept() out of file descriptors) once
per interval, with the count of what it held back."""

from __future__ import annotations

import asyncio
import logging

from infer.server.http_server import RateLimitedErrors


def test_a_flood_of_one_error_is_one_line_per_interval(caplog, monkeypatch):
    handler = RateLimitedErrors()
    clock = iter([0.0] * 1000 + [11.0, 11.0])
    monkeypatch.setattr("infer.server.http_server.time.monotonic", lambda: next(clock))
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(1000):
                handler.handle(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24)})
            handler.handle(loop, {"message": "socket.accept() out of system resource", "exception": OSError(24)})
            handler.handle(loop, {"message": "another error"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert "and 999 more in the last 10 s" in lines[1] and lines[2] == "another error"
