"""Start a real infer server for tests: the engine core in its own process, as `infer serve` runs it, and the
API server (uvicorn on a free local port) in a background thread of the test process, so tests can reach its
state; or the whole `infer serve` command in a subprocess."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from infer.engine.config import EngineConfig
from infer.build.core_process import CoreProcess
from infer.frontend.dp_client import client_for
from infer.build.dp_cores import start_cores
from infer.server.app import create_app
from infer.server.http_server import uvicorn_config
from infer.server.launch import served_model
from infer.server.limits import ServerLimits
from infer.server.state import ServerState

MODEL = "smollm2"


@dataclass
class RunningServer:
    base_url: str
    state: ServerState
    core: CoreProcess
    cores: list[CoreProcess] = field(default_factory=list)  # every engine core (data_parallel_size of them)

    def call(self, method: str, *args: Any, timeout: float = 60.0) -> Any:
        """A utility call into the engine core (between two of its steps), from the test's thread."""
        client = self.state.engine
        return asyncio.run_coroutine_threadsafe(client.call(method, *args), client._loop).result(timeout)

    def audit_blocks(self) -> dict[int, str]:
        """The core's KV blocks still held by requests: empty when nothing leaked."""
        return self.call("audit_blocks")

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until the core has nothing queued or running (aborts are applied at its next step)."""
        deadline = time.monotonic() + timeout
        while not self.call("idle"):
            if time.monotonic() > deadline:
                raise TimeoutError("engine still busy")
            time.sleep(0.05)


def process_gone(pid: int, within_s: float) -> bool:
    """Whether process `pid` has exited within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


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
def running_server(model: object, limits: ServerLimits | None = None, **engine_options: Any) -> Iterator[RunningServer]:
    """A core process for EngineConfig(model=model, **engine_options) (one per data-parallel engine) and an API
    server in a thread, with the HTTP limits `infer serve` would have (or `limits`)."""
    cores = start_cores(EngineConfig(model=str(model), **engine_options), timeout_s=600)
    try:
        served = served_model(cores[0].info)
        limits = limits or ServerLimits()
        state = ServerState(served, client_for([c.info for c in cores], served.tokenizer), MODEL, limits=limits)
        port = free_port()
        server = uvicorn.Server(uvicorn_config(create_app(state), limits, "warning", host="127.0.0.1", port=port))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, timeout=30)
        try:
            yield RunningServer(base, state, cores[0], cores)
        finally:
            server.should_exit = True
            thread.join(timeout=30)
    finally:
        for core in cores:
            core.stop()


class _Printed:
    """A process's output, read as it comes: a pipe nobody reads blocks the server at its next print once it holds
    64 KiB."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.append(line)

    def text(self, wait_s: float = 10.0) -> str:
        """What it printed so far; all of it once the process has exited (the reader reaches the end)."""
        self._thread.join(wait_s)
        return "".join(self._lines)


@dataclass
class ServeProcess:
    """`infer serve` running in a subprocess."""

    base_url: str
    proc: subprocess.Popen
    printed: _Printed

    def output(self) -> str:
        """Everything it printed (after it has exited)."""
        return self.printed.text()


@contextmanager
def serve_process(*flags: str, timeout: float = 120) -> Iterator[ServeProcess]:
    """`infer serve` as a user starts it, in its own process on a free port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "infer.cli", "serve", "--port", str(port), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed = _Printed(proc)

    def still_running() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"infer serve exited with {proc.returncode}: {printed.text()}")

    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, timeout=timeout, still_starting=still_running)
        yield ServeProcess(base, proc, printed)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:  # longer than the server's own bound: it kills an API server still draining after ~40 s
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                _kill_stuck(proc, printed)


STOP_WAIT_S = 60


def _kill_stuck(proc: subprocess.Popen, printed: _Printed) -> None:
    """A server still running STOP_WAIT_S after SIGTERM: SIGABRT to it and its children (with PYTHONFAULTHANDLER
    set each prints its threads' stacks), then SIGKILL, so no process is left holding the port or the GPU; raises
    with what it printed."""
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    for pid in [*map(int, children), proc.pid]:
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    time.sleep(3)
    for pid in [*map(int, children), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    raise RuntimeError(f"infer serve did not exit within {STOP_WAIT_S} s of SIGTERM; it printed:\n"
                       f"{printed.text()[-20000:]}")
