"""An API server that gets SIGTERM before it serves (still starting while another answers on the port) stops as
soon as it has started, instead of serving until its supervisor kills it."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import uvicorn

from infer.server.http_server import DrainingServer
from infer.server.launch import stop_on_sigterm
from infer.server.limits import ServerLimits


class _Engine:
    num_live = 0

    def abort_all(self) -> int:
        return 0


async def _app(scope, receive, send):  # never called: nothing connects
    raise AssertionError("no request expected")


def test_a_sigterm_before_serving_stops_the_server_right_after_start_up():
    server = DrainingServer(uvicorn.Config(_app, log_level="warning", lifespan="off"), ServerLimits(), _Engine())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    backstop = threading.Timer(10, lambda: setattr(server, "should_exit", True))  # a failing run ends, too
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm(server)
        os.kill(os.getpid(), signal.SIGTERM)
        backstop.start()
        started = time.perf_counter()
        server.run(sockets=[sock])
        assert time.perf_counter() - started < 5
    finally:
        backstop.cancel()
        signal.signal(signal.SIGTERM, previous)
        sock.close()
