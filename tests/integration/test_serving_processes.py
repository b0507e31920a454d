"""`infer serve` as processes: a killed engine core gives 503s and a non-zero exit with the reason; the core
never outlives the server (SIGTERM stops both, a killed server's core exits by itself);
`--api-server-count 2` serves from both API server processes, /metrics counts across them, and a killed
API server leaves the other serving."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from server_harness import process_gone, serve_process

pytestmark = pytest.mark.slow

BODY = {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}


def _health(base: str) -> dict:
    with httpx.Client() as fresh:  # a new connection: the kernel may hand it to either API server
        return fresh.get(f"{base}/health", timeout=10).json()


def test_a_killed_core_gives_503s_and_a_non_zero_exit_with_the_reason():
    with serve_process("--max-seq-len", "256") as served:
        base = served.base_url
        core_pid = _health(base)["core_pid"]
        long = BODY | {"max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=long, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            os.kill(core_pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" or "error" in rest[-1]
        assert any("error" in json.loads(line[6:]) for line in rest if line.startswith("data: {"))
        answers = []
        for _ in range(20):  # until the server has stopped listening
            try:
                answers.append(httpx.post(f"{base}/v1/completions", json=BODY, timeout=10).status_code)
            except httpx.TransportError:
                break
            time.sleep(0.05)
        assert set(answers) <= {503}
        assert served.proc.wait(timeout=30) == 1
        out = served.output()
        assert f"engine core process (pid {core_pid}) exited" in out and "Traceback" not in out


def test_sigterm_stops_the_server_and_its_core():
    with serve_process("--max-seq-len", "256") as served:
        core_pid = _health(served.base_url)["core_pid"]
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=30) == 0
        assert process_gone(core_pid, within_s=15)


def test_a_killed_server_does_not_leave_its_core_running():
    with serve_process("--max-seq-len", "256") as served:
        core_pid = _health(served.base_url)["core_pid"]
        served.proc.kill()
        served.proc.wait(timeout=10)
        assert process_gone(core_pid, within_s=15)  # the core notices its parent is gone (checked once a second)


def test_two_api_servers_share_the_port_and_count_metrics_together():
    with serve_process("--max-seq-len", "256", "--api-server-count", "2") as served:
        base = served.base_url
        seen = {}
        for _ in range(200):
            health = _health(base)
            seen[health["api_server"]] = health["pid"]
            if len(seen) == 2:
                break
        assert sorted(seen) == [0, 1] and len(set(seen.values())) == 2
        core = {_health(base)["core_pid"] for _ in range(8)}
        assert len(core) == 1  # one engine core behind both

        tokens = 0
        for i in range(12):
            with httpx.Client() as fresh:
                reply = fresh.post(f"{base}/v1/completions", json=BODY | {"prompt": f"Story {i}:"}, timeout=60)
            assert reply.status_code == 200
            tokens += reply.json()["usage"]["completion_tokens"]
        time.sleep(2.5)  # every API server's heartbeat has carried its counts to the core
        for _ in range(4):  # whichever server answers, the totals are the same
            metrics = httpx.get(f"{base}/metrics", timeout=10).text
            line = next(x for x in metrics.splitlines() if x.startswith("infer:generation_tokens_total"))
            assert float(line.split()[-1]) == tokens

        # one API server killed: the other keeps serving from the same core
        victim = seen[0]
        os.kill(victim, signal.SIGKILL)
        time.sleep(1.0)  # connections already in its accept queue are reset with it
        for _ in range(10):
            with httpx.Client() as fresh:
                assert fresh.post(f"{base}/v1/completions", json=BODY, timeout=60).status_code == 200
        pids = {h["pid"] for h in (_health(base) for _ in range(10))}
        assert seen[1] in pids and victim not in pids  # the supervisor may have started its replacement already
        assert served.proc.poll() is None
