"""`infer serve` as a user runs it, stopped while it serves a generation that would never end on its own: SIGTERM
drains for --shutdown-timeout-s, aborts what is left (finish_reason "abort") and exits 0; a second signal exits at
once. A port already in use is an error before the model loads."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest

from server_harness import free_port, serve_process

pytestmark = pytest.mark.slow

ENDLESS = {"prompt": "Once upon a time", "max_tokens": 3500, "ignore_eos": True, "stream": True}


class _Endless:
    """A streamed generation far longer than the test: its chunks and finish reason, read on a thread."""

    def __init__(self, base_url: str) -> None:
        self.chunks: list[dict] = []
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(base_url,), daemon=True)
        self._thread.start()
        assert self.started.wait(120), "the stream did not start"

    def _read(self, base_url: str) -> None:
        try:
            with httpx.stream("POST", f"{base_url}/v1/completions", json=ENDLESS, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        self.chunks.append(json.loads(line[6:]))
                        self.started.set()
        except httpx.HTTPError:
            pass  # the connection closed with the server

    def finish_reason(self) -> str | None:
        self._thread.join(30)
        return self.chunks[-1]["choices"][0]["finish_reason"] if self.chunks else None


def test_sigterm_aborts_a_never_ending_request_at_the_deadline_and_exits_0():
    with serve_process("--max-seq-len", "4096", "--shutdown-timeout-s", "2") as served:
        stream = _Endless(served.base_url)
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=60) == 0
        assert stream.finish_reason() == "abort"
        assert len(stream.chunks) < ENDLESS["max_tokens"]
        output = served.output()
        assert "--shutdown-timeout-s" in output, output[-2000:]


def test_a_second_sigterm_exits_at_once():
    with serve_process("--max-seq-len", "4096", "--shutdown-timeout-s", "600") as served:
        _Endless(served.base_url)
        served.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            served.proc.wait(timeout=2)  # draining: the generation goes on
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(timeout=60)  # far inside the 600 s drain
        out = served.output()
    assert "second SIGTERM: exiting now" in out and "Traceback" not in out and "CancelledError" not in out, out


@pytest.mark.parametrize("api_servers", [1, 2])
def test_a_port_in_use_fails_before_the_model_loads(api_servers):
    """Also when the listener there shares its port (SO_REUSEPORT, as several API servers do) and this server would
    too: it must not split another server's connections."""
    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = subprocess.run([sys.executable, "-m", "infer.cli", "serve", "--port", str(port),
                                 "--api-server-count", str(api_servers)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"--port={port}" in result.stderr and "in use" in result.stderr
    assert "loading" not in result.stderr.lower() and "serving on" not in result.stdout + result.stderr
