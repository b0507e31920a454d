"""The server end to end with the official `openai` client, httpx for raw HTTP, on the bundled SmolLM2."""

from __future__ import annotations

import asyncio
import json
import os
import time

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from server_harness import MODEL, running_server

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,",
           "The best way to learn", "Water boils at", "My favourite colour is", "In 1492,", "Dear diary,"]


def _greedy(**kw):
    return {"model": MODEL, "temperature": 0, **kw}


def test_completion_validates_and_usage_adds_up(client, server):
    out = client.completions.create(prompt="The capital of France is", max_tokens=6, **_greedy())
    assert isinstance(out, Completion) and out.object == "text_completion"
    assert out.choices[0].finish_reason == "length" and out.choices[0].text
    count = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "The capital of France is"}).json()["count"]
    assert out.usage.prompt_tokens == count and out.usage.completion_tokens == 6
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


@pytest.mark.parametrize("prompt", ["Once upon a time", [[504, 3458, 253, 655], [1, 2, 3]], ["Hi", "Bye"]])
def test_prompt_forms_give_one_choice_per_prompt(client, prompt):
    out = client.completions.create(prompt=prompt, max_tokens=3, **_greedy())
    expected = 1 if isinstance(prompt, str) else len(prompt)
    assert [c.index for c in out.choices] == list(range(expected))


def test_stream_joins_to_the_non_streamed_text_with_one_terminal_chunk(client):
    whole = client.completions.create(prompt="Once upon a time", max_tokens=24, **_greedy())
    chunks = list(client.completions.create(prompt="Once upon a time", max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, **_greedy()))
    assert all(isinstance(c, Completion) for c in chunks)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text


def test_chat_stream_equals_chat_completion(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(messages=messages, max_tokens=40, **_greedy())
    assert isinstance(whole, ChatCompletion) and whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason == "stop" and "Paris" in whole.choices[0].message.content
    chunks = list(client.chat.completions.create(messages=messages, max_tokens=40, stream=True,
                                                 stream_options={"include_usage": True}, **_greedy()))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_and_max_tokens_finish_reasons(client):
    free = client.completions.create(prompt="1, 2, 3, 4,", max_tokens=20, **_greedy())
    assert " 7" in free.choices[0].text
    cut = client.completions.create(prompt="1, 2, 3, 4,", max_tokens=20, stop=[" 7"], **_greedy())
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == free.choices[0].text[: free.choices[0].text.index(" 7")]


def test_seeded_request_alone_equals_amid_eight_concurrent_others(server):
    seeded = {"model": MODEL, "prompt": "Tell me about the ocean.", "max_tokens": 16, "temperature": 1.0,
              "top_p": 0.9, "seed": 1234, "extra_body": {"ignore_eos": True}}

    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as c:
            alone = (await c.completions.create(**seeded)).choices[0].text
            others = [c.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0.8) for p in PROMPTS[:8]]
            results = await asyncio.gather(c.completions.create(**seeded), *others)
            return alone, results[0].choices[0].text

    alone, amid = asyncio.run(run())
    assert alone == amid


def test_concurrent_greedy_requests_equal_one_by_one(server, client):
    one_by_one = [client.completions.create(prompt=p, max_tokens=10, **_greedy()).choices[0].text for p in PROMPTS]

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0) as c:
            outs = await asyncio.gather(*[c.completions.create(prompt=p, max_tokens=10, **_greedy()) for p in PROMPTS])
            return [o.choices[0].text for o in outs]

    assert asyncio.run(run()) == one_by_one


def test_prompt_logprobs_cover_every_position_on_a_warm_prefix_cache(client):
    """A prompt in the prefix cache is still computed whole for a request that asks for its prompt logprobs."""
    prompt = "Rivers carry sediment from the mountains to the sea, shaping deltas over centuries. " * 3
    cold = client.completions.create(prompt=prompt, echo=True, logprobs=1, max_tokens=1, **_greedy())
    plain = client.completions.create(prompt=prompt, max_tokens=1, **_greedy())
    assert plain.usage.prompt_tokens_details.cached_tokens > 0  # the cache is warm
    warm = client.completions.create(prompt=prompt, echo=True, logprobs=1, max_tokens=1, **_greedy())
    assert warm.usage.prompt_tokens_details.cached_tokens == 0
    cold_lps, warm_lps = cold.choices[0].logprobs.token_logprobs, warm.choices[0].logprobs.token_logprobs
    assert len(warm_lps) == warm.usage.prompt_tokens + 1 and warm_lps[0] is None
    assert warm_lps[1:] == pytest.approx(cold_lps[1:], abs=1e-4)


def test_echo_logprobs_as_lm_eval_reads_them(client, server):
    ids = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "The capital of France is Paris"}).json()["tokens"]
    out = client.completions.create(prompt=[ids], echo=True, logprobs=1, max_tokens=1, **_greedy())
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(t, dict) and 1 <= len(t) <= 2 for t in lp.top_logprobs[1:])
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[-1][lp.tokens[-1]] == max(lp.top_logprobs[-1].values())  # greedy picks the argmax
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert out.choices[0].text.startswith("The capital of France is Paris")
    scored = client.completions.create(prompt=[ids], echo=True, logprobs=0, max_tokens=0, **_greedy())
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:-1], abs=1e-4)


def test_chat_logprobs_shape(client):
    out = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=3, logprobs=True,
                                         top_logprobs=2, **_greedy())
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob for c in content)
    if out.choices[0].finish_reason == "length":  # every token is text: their own bytes join into it
        assert bytes(b for c in content for b in c.bytes).decode("utf-8") == out.choices[0].message.content


def test_n_choices_differ_and_are_indexed(client):
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0, seed=5)
    assert [c.index for c in out.choices] == [0, 1, 2] and len({c.text for c in out.choices}) > 1


def test_models_health_metrics_and_tokenizer_endpoints(server):
    base = server.base_url
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == MODEL
    health = httpx.get(f"{base}/health").json()
    assert health == {"status": "ok", "api_server": 0, "pid": os.getpid(), "core_pid": server.core.process.pid}
    info = httpx.get(f"{base}/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>"
    assert httpx.post(f"{base}/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False}).json()["tokens"] == [2]
    ids = httpx.post(f"{base}/tokenize", json={"prompt": "Hello world"}).json()["tokens"]
    assert httpx.post(f"{base}/detokenize", json={"tokens": ids}).json() == {"prompt": "Hello world"}
    metrics = httpx.get(f"{base}/metrics").text
    for name in ("infer:num_requests_running", "infer:kv_cache_blocks_free", "infer:time_to_first_token_seconds_bucket",
                 "infer:inter_token_latency_seconds_count", "infer:generation_tokens_total"):
        assert name in metrics


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ("{not json", 400, None),
        ({"model": MODEL}, 400, "prompt"),
        ({"prompt": "Hi", "temperature": -1}, 422, "temperature"),
        ({"prompt": "Hi", "model": "gpt-4"}, 404, "model"),
        ({"prompt": "Hi", "best_of": 2}, 400, "best_of"),
        ({"prompt": "Hi", "logprobs": 50}, 422, "logprobs"),
        ({"prompt": [], "max_tokens": 1}, 422, "prompt"),
        ({"prompt": [10**9]}, 422, "prompt"),
        ({"prompt": "Hi", "max_tokens": "many"}, 422, "max_tokens"),
        ({"prompt": "Hi", "stop": ["x"] * 17}, 422, "stop"),
        ({"prompt": "Hi", "stop": "y" * 60_000}, 422, "stop"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, param):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{server.base_url}/v1/completions", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"] and err["param"] == param


def test_unknown_fields_are_refused_by_name(client):
    assert client.completions.create(prompt="Hi", max_tokens=2, user="me", **_greedy()).choices[0].text is not None
    with pytest.raises(openai.BadRequestError, match="whatever"):
        client.completions.create(prompt="Hi", max_tokens=2, extra_body={"whatever": 1}, **_greedy())


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
    server.wait_idle()
    assert server.audit_blocks() == {}
    assert 'finished_reason="abort"' in httpx.get(f"{server.base_url}/metrics").text


def test_full_waiting_queue_answers_503_and_others_keep_streaming(smollm2_gguf):
    with running_server(smollm2_gguf, max_seq_len=1024, max_batch_size=1, max_waiting_requests=1) as server:
        _full_queue(server)


def _full_queue(server) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True}
    url = f"{server.base_url}/v1/completions"
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", url, json=body) as running:
            running_lines = running.iter_lines()
            assert next(line for line in running_lines if line.startswith("data:"))
            with http.stream("POST", url, json=body) as queued:
                assert queued.status_code == 200
                deadline = time.monotonic() + 30
                while server.state.engine.num_waiting < 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
                r = httpx.post(url, json={"model": MODEL, "prompt": "Hi", "max_tokens": 1})
                assert r.status_code == 503 and "full" in r.json()["error"]["message"]
                assert int(r.headers["retry-after"]) >= 1
                assert next(line for line in running_lines if line.startswith("data:"))  # still streaming
    server.wait_idle()
    assert server.audit_blocks() == {}
