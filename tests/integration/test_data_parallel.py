"""Data parallelism on the bundled SmolLM2: two engine cores behind one API server give every request (greedy,
seeded, n > 1) the output one engine gives; the requests spread over both; aborts, /metrics, /health and the
idle and block audits reach both; `infer serve -dp 2` with a core killed fails only that core's streams and starts
it again; a killed API server is started again; offline, `LLM(data_parallel_size=2)` is a DataParallelLLM (and an
LLM) that gives the in-process engine's greedy outputs; on a tiny model, four cores offline and behind one API server
answer as one engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from infer import LLM, SamplingParams
from infer.dp_llm import SEND_EVERY, DataParallelLLM
from server_harness import MODEL, process_gone, running_server, serve_process

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "My favourite colour is",
           "The three laws of robotics are", "Water boils at", "A haiku about autumn:", "import numpy as np\n"]


@pytest.fixture(scope="module")
def dp1(smollm2_gguf):
    with running_server(smollm2_gguf, max_seq_len=512) as running:
        yield running


@pytest.fixture(scope="module")
def dp2(smollm2_gguf):
    with running_server(smollm2_gguf, max_seq_len=512, data_parallel_size=2) as running:
        yield running


def _bodies() -> list[dict]:
    greedy = [{"prompt": p, "max_tokens": 16, "temperature": 0} for p in PROMPTS]
    seeded = [{"prompt": p, "max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": 11 + i}
              for i, p in enumerate(PROMPTS)]
    several = [{"prompt": PROMPTS[0], "max_tokens": 12, "temperature": 1.0, "seed": 3, "n": 3}]
    return [{"model": MODEL, **b} for b in greedy + seeded + several]


def _complete_all(base: str) -> list[list[str]]:
    """Every body at once (the engines batch them); each answer's choice texts."""
    with httpx.Client(timeout=120) as http, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda b: http.post(f"{base}/v1/completions", json=b), _bodies()))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers if a.status_code != 200]
    return [[c["text"] for c in sorted(a.json()["choices"], key=lambda c: c["index"])] for a in answers]


def test_every_request_gets_the_output_of_one_engine_and_both_engines_work(dp1, dp2):
    assert _complete_all(dp2.base_url) == _complete_all(dp1.base_url)
    finished = [sum(c.metrics.finished.values()) for c in dp2.state.engine.clients]
    assert sum(finished) == 2 * len(PROMPTS) + 3 and min(finished) >= 4  # least load spread them over both


def test_health_lists_both_cores(dp2):
    health = httpx.get(f"{dp2.base_url}/health").json()
    assert health["core_pids"] == [c.process.pid for c in dp2.cores] and len(set(health["core_pids"])) == 2


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def _engine_call(client, method: str, *args):
    """A utility call through one engine's own client (not the DP fan-out), from the test's thread."""
    return asyncio.run_coroutine_threadsafe(client.call(method, *args), client._loop).result(30)


def test_metrics_sum_both_engines(dp2):
    httpx.post(f"{dp2.base_url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                                                       "temperature": 0}, timeout=60).raise_for_status()
    text = httpx.get(f"{dp2.base_url}/metrics", timeout=30).text
    clients = dp2.state.engine.clients
    totals = [_engine_call(c, "metrics", c.metrics.snapshot())[0].kv_blocks_total for c in clients]
    blocks = _metric(text, "infer:kv_cache_blocks_free") + _metric(text, "infer:kv_cache_blocks_used")
    assert len(totals) == 2 and blocks == sum(totals)
    served = sum(c.metrics.generation_tokens for c in clients)
    assert _metric(text, "infer:generation_tokens_total") == served > 0


def test_aborts_reach_the_engine_that_owns_each_request(dp2):
    body = {"model": MODEL, "prompt": "Count to a thousand:", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
        with a.stream("POST", f"{dp2.base_url}/v1/completions", json=body) as ra, \
                b.stream("POST", f"{dp2.base_url}/v1/completions", json=body) as rb:
            lines = [r.iter_lines() for r in (ra, rb)]
            first = [next(line for line in it if line.startswith("data: {")) for it in lines]
            assert all(first) and [c.num_live for c in dp2.state.engine.clients] == [1, 1]  # one on each engine
    dp2.wait_idle()  # both engines: nothing queued or running once the aborts landed
    assert dp2.audit_blocks() == {}
    assert [c.num_live for c in dp2.state.engine.clients] == [0, 0]


def _stream(base: str, body: dict) -> str:
    """One streamed completion's end: its finish reason, or "error" when a chunk carried one."""
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return "error"
            if chunk["choices"] and chunk["choices"][0]["finish_reason"]:
                return chunk["choices"][0]["finish_reason"]
    return "cut"


def test_infer_serve_dp2_survives_a_killed_core_and_restarts_it():
    """kill -9 of one core of two while 8 streams run: only its streams fail, the other core's finish, new
    requests are served meanwhile, /health says degraded, and the core is started again on its address."""
    with serve_process("-dp", "2", "--max-seq-len", "256") as served:
        base = served.base_url
        pids = httpx.get(f"{base}/health", timeout=10).json()["core_pids"]
        assert len(pids) == 2
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
        long = body | {"max_tokens": 150, "ignore_eos": True, "stream": True}
        with ThreadPoolExecutor(8) as pool:
            ends = [pool.submit(_stream, base, long) for _ in range(8)]
            deadline = time.monotonic() + 60
            while _running(base) < 8 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(pids[1], signal.SIGKILL)
            for _ in range(100):  # the API server hears of it when the core's connection drops
                degraded = httpx.get(f"{base}/health", timeout=10)
                if degraded.json()["status"] == "degraded":
                    break
                time.sleep(0.05)
            assert httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code == 200  # the live core
            results = [f.result() for f in ends]
        assert results.count("length") >= 1 and results.count("error") >= 1, results
        assert results.count("length") + results.count("error") == 8, results
        assert degraded.status_code == 200 and degraded.json()["dead_engines"] == [1]
        for _ in range(600):  # the restart loads the model again
            health = httpx.get(f"{base}/health", timeout=10).json()
            if health["status"] == "ok":
                break
            time.sleep(0.1)
        assert health["status"] == "ok", health
        with ThreadPoolExecutor(8) as pool:  # both engines take requests again
            assert all(code == 200 for code in pool.map(
                lambda _: httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code, range(8)))
        assert process_gone(pids[1], within_s=1)
    out = served.output()
    assert re.search(r"engine core 1 \(pid \d+\) was killed by signal SIGKILL", out), out
    assert re.search(r"engine core 1 restarted in [\d.]+s", out), out


def _running(base: str) -> int:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return int(float(re.search(r"^infer:num_requests_running\{[^}]*\} (\S+)", text, re.M).group(1)))


def test_a_killed_api_server_is_started_again():
    """Two API servers routing over two cores through their shared load board; one killed is started again (on its
    row of the board) and both serve."""
    with serve_process("--api-server-count", "2", "-dp", "2", "--max-seq-len", "256") as served:
        base = served.base_url
        victim = httpx.get(f"{base}/health", timeout=10).json()["pid"]
        os.kill(victim, signal.SIGKILL)
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2}
        deadline = time.monotonic() + 60
        seen: set[int] = set()
        while time.monotonic() < deadline and len(seen) < 2:  # both API servers answer again
            try:
                seen.add(httpx.get(f"{base}/health", timeout=5).json()["pid"])
                assert httpx.post(f"{base}/v1/completions", json=body, timeout=30).status_code == 200
            except httpx.TransportError:
                pass
        assert len(seen - {victim}) == 2
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: httpx.post(f"{base}/v1/completions", json=body, timeout=60).status_code,
                                  range(8)))
        assert codes == [200] * 8
    out = served.output()
    assert re.search(r"API server infer-api-\d was killed by signal SIGKILL; started again", out), out


def test_offline_llm_with_data_parallel_size_2_gives_the_outputs_of_one_engine(smollm2_gguf, smollm2_llm):
    params = SamplingParams(temperature=0, max_tokens=12)
    with LLM(str(smollm2_gguf), max_seq_len=1024, data_parallel_size=2) as llm:
        assert type(llm) is DataParallelLLM and isinstance(llm, LLM)
        texts = [out.text for out in llm.generate(PROMPTS, params)]
        # more prompts than go to the cores at once (dp_llm.SEND_EVERY): every batch sent, answers in prompt order
        many = [f"{prompt} {i}" for i in range(9) for prompt in PROMPTS]
        assert len(many) > SEND_EVERY
        short = SamplingParams(temperature=0, max_tokens=2)
        many_ids = [out.token_ids for out in llm.generate(many, short)]
    assert texts == [out.text for out in smollm2_llm.generate(PROMPTS, params)]
    assert many_ids == [out.token_ids for out in smollm2_llm.generate(many, short)]


def test_offline_llm_with_data_parallel_size_4_gives_the_outputs_of_one_engine(tmp_path):
    """Four cores on a tiny model (DP=4 is checked here, no 4-GPU machine needed): one engine's greedy outputs, in
    prompt order, with more prompts than the cores are sent at once."""
    from checkpoints import save_tiny_with_tokenizer

    path = str(save_tiny_with_tokenizer("llama", tmp_path / "llama"))
    prompts = [[1 + (7 * i + j) % 300 for j in range(3 + i % 11)] for i in range(2 * SEND_EVERY + 5)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM(path) as one:
        want = [out.token_ids for out in one.generate_ids(prompts, params)]
    with LLM(path, data_parallel_size=4) as four:
        assert len(four.cores) == 4
        assert [out.token_ids for out in four.generate_ids(prompts, params)] == want


def test_four_cores_behind_one_api_server_answer_as_one_and_all_work(tmp_path):
    """`-dp 4` (checked on the CPU, no 4-GPU machine needed): every request the output one engine gives, and the
    least-load routing gives each of the four cores some."""
    from checkpoints import save_tiny_with_tokenizer

    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    bodies = [{"model": MODEL, "prompt": f"{p} {i}", "max_tokens": 8, "temperature": 0} for i in range(3)
              for p in PROMPTS]

    def answers(base: str) -> list[str]:
        with httpx.Client(timeout=120) as http, ThreadPoolExecutor(8) as pool:
            out = list(pool.map(lambda b: http.post(f"{base}/v1/completions", json=b), bodies))
        assert all(a.status_code == 200 for a in out), [a.text for a in out if a.status_code != 200]
        return [a.json()["choices"][0]["text"] for a in out]

    with running_server(path, max_seq_len=256) as one:
        want = answers(one.base_url)
    with running_server(path, max_seq_len=256, data_parallel_size=4) as four:
        assert answers(four.base_url) == want
        finished = [sum(c.metrics.finished.values()) for c in four.state.engine.clients]
    assert sum(finished) == len(bodies) and min(finished) >= 1, finished
