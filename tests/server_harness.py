"""Start a real infer server (uvicorn on a free local port, in a background thread) for tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base_url: str, timeout: float, still_starting: Callable[[], None] = lambda: None) -> None:
    """Poll GET /health until 200; `still_starting` runs between tries and may raise (e.g. the process died)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        still_starting()
        if time.monotonic() > deadline:
            raise TimeoutError(f"server at {base_url} did not start within {timeout:.0f} s")
        time.sleep(0.1)


@contextmanager
def running_server(llm: LLM) -> Iterator[RunningServer]:
    state = ServerState(llm.built, AsyncEngine(llm.engine, llm.config.max_waiting_requests), MODEL)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, timeout=30)
    try:
        yield RunningServer(base, state)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def serve_process(*flags: str, timeout: float = 120) -> Iterator[str]:
    """`infer serve` as a user starts it, in its own process on a free port; yields the base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "infer.cli", "serve", "--port", str(port), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def still_running() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"infer serve exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")

    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, timeout=timeout, still_starting=still_running)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
