"""Start a real infer server (uvicorn on a free local port, in a background thread) for tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from infer.engine.async_engine import AsyncEngine
from infer.llm import LLM
from infer.server.app import create_app
from infer.server.state import ServerState

MODEL = "smollm2"


@dataclass
class RunningServer:
    base_url: str
    state: ServerState

    @property
    def engine(self):
        return self.state.engine.engine

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until the engine has nothing queued or running (aborts are applied at the next step)."""
        deadline = time.monotonic() + timeout
        while self.engine.has_unfinished() or self.state.engine.num_waiting:
            if time.monotonic() > deadline:
                raise TimeoutError("engine still busy")
            time.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(llm: LLM) -> Iterator[RunningServer]:
    state = ServerState(llm, AsyncEngine(llm.engine, llm.config.max_waiting_requests), MODEL)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("server did not start")
        time.sleep(0.1)
    try:
        yield RunningServer(base, state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
