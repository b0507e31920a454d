"""LoRA adapters through a real `infer serve` process and real HTTP clients (vLLM's interface: --enable-lora,
--lora-modules NAME=PATH, --max-loras, --max-lora-rank; `model: NAME` runs an adapter; /v1/models lists each adapter
with its parent and root; POST /v1/load_lora_adapter and /v1/unload_lora_adapter at run time).

One LoRA server (--max-loras 2, --max-cpu-loras 2) serves every test but the last (a server without --enable-lora).
Each test leaves the server's set of adapters as it found it ({base, a}). Greedy tokens are compared with
transformers + peft's (`reference`) through the completions' logprobs: each generated token's text, plus the whole
text."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from lora_adapters import reference, save_adapter, write_random_adapter
from server_harness import serve_process

MAX_TOKENS = 6
PROMPT_TEXT = "The cat sat on the"
# more than two KV blocks (16 tokens each): the prefix cache holds its first two
LONG_TEXT = "The cat sat on the mat. Call 555-1234 today! yes no maybe. The name is Tom, age 3. The cat sat on the"
SERVE_FLAGS = ("--max-seq-len", "256", "--api-server-count", "1", "--device", "cpu", "--dtype", "float32")
# the tiny tokenizer has no chat template (nor a family one): chat requests render with this one
CHAT_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def ensure(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


# ----------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The tiny Llama base and its adapters (written by peft), plus bad adapters for the refusals."""
    root = tmp_path_factory.mktemp("lora")
    base = save_tiny_with_tokenizer("llama", root / "base", seed=3)
    out = {"base": base,
           "a": save_adapter(base, root / "a", rank=8, seed=11),
           "b": save_adapter(base, root / "b", rank=16, targets=("q_proj", "v_proj"), seed=12),
           "b2": save_adapter(base, root / "b2", rank=4, targets=("o_proj", "down_proj", "up_proj"), seed=13),
           "c": save_adapter(base, root / "c", rank=16, targets=("k_proj", "gate_proj"), seed=14, use_rslora=True),
           "rank32": save_adapter(base, root / "rank32", rank=32, targets=("q_proj",), seed=15)}
    other = save_tiny_with_tokenizer("llama", root / "other-base", seed=4, hidden_size=96)
    out["other_hidden"] = save_adapter(other, root / "other-hidden", rank=8, seed=16)
    deeper = save_tiny_with_tokenizer("llama", root / "deeper-base", seed=4, num_hidden_layers=4)
    out["other_layers"] = save_adapter(deeper, root / "other-layers", rank=8, targets=("q_proj",), seed=17)
    out["dora"] = save_adapter(base, root / "dora", rank=8, targets=("q_proj",), seed=18, use_dora=True)
    with warnings.catch_warnings():  # peft: "Setting `save_embedding_layers` to `True`" (it saves the LM head too)
        warnings.simplefilter("ignore", UserWarning)
        out["lm_head"] = save_adapter(base, root / "lm-head", rank=8, targets=("lm_head",), seed=19)
    out["fc1"] = write_random_adapter(root / "fc1", 3, {"fc1": (128, 64)}, rank=8)
    out["no_config"] = root / "no-config"
    out["no_config"].mkdir()
    (out["no_config"] / "adapter_model.safetensors").write_bytes((out["a"] / "adapter_model.safetensors").read_bytes())
    corrupt = save_adapter(base, root / "corrupt", rank=8, seed=20)
    weights = corrupt / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a whole header, its data cut short
    out["corrupt"] = corrupt
    out["template"] = root / "chat.jinja"
    out["template"].write_text(CHAT_TEMPLATE)
    return out


@pytest.fixture(scope="module")
def tokenizer(files):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(files["base"])


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    ids = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    ensure(len(ids) >= 3, f"the prompt should be a few tokens, got {ids}")
    return ids


@pytest.fixture(scope="module")
def long_prompt(tokenizer) -> list[int]:
    ids = tokenizer.encode(LONG_TEXT, add_special_tokens=False)
    ensure(len(ids) > 32, f"the long prompt should fill two KV blocks, got {len(ids)} tokens")
    return ids


@pytest.fixture(scope="module")
def server(files):
    """`infer serve --enable-lora --lora-modules a=... --max-loras 2 --max-lora-rank 16` on the CPU."""
    with serve_process("--model", str(files["base"]), *SERVE_FLAGS, "--enable-lora", "--lora-modules",
                       f"a={files['a']}", "--max-loras", "2", "--max-lora-rank", "16", "--max-cpu-loras", "2",
                       "--chat-template", str(files["template"])) as served:
        yield served


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def base_name(http) -> str:
    cards = http.get("/v1/models").json()["data"]
    bases = [c["id"] for c in cards if c["parent"] is None]
    ensure(len(bases) == 1, f"/v1/models should list exactly one base model, got {cards}")
    return bases[0]


# ----------------------------------------------------------------------------------------------------- helpers


def greedy_reference(files: dict[str, Path], adapter: str | None, prompt: list[int], tokenizer,
                     max_tokens: int = MAX_TOKENS) -> tuple[list[str], str]:
    """Each greedy token's text and the whole text, as transformers + peft generate them (EOS does not end them:
    the server ignores it)."""
    ids = greedy_reference_ids(files, adapter, prompt, max_tokens)
    return ([tokenizer.decode([t], skip_special_tokens=False) for t in ids],  # as the logprobs name each token
            tokenizer.decode(ids, skip_special_tokens=True))  # as the server's text (skip_special_tokens defaults on)


def greedy_reference_ids(files: dict[str, Path], adapter: str | None, prompt: list[int],
                         max_tokens: int = MAX_TOKENS) -> list[int]:
    model = reference(files["base"], files[adapter] if adapter else None)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    ids = out[0, len(prompt):].tolist()
    ensure(len(ids) == max_tokens, f"the reference generated {len(ids)} tokens, wanted {max_tokens}")
    return ids


def complete(http: httpx.Client, model: str, prompt: list[int], max_tokens: int = MAX_TOKENS) -> httpx.Response:
    return http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                              "temperature": 0, "logprobs": 0, "ignore_eos": True})


def served_tokens(http: httpx.Client, model: str, prompt: list[int], max_tokens: int = MAX_TOKENS
                  ) -> tuple[list[str], str]:
    """Each greedy token's text (its logprobs entry) and the whole text, as the server generates them under `model`
    (200 and max_tokens tokens checked)."""
    response = complete(http, model, prompt, max_tokens)
    ensure(response.status_code == 200, f"completion with model={model!r}: {response.status_code} {response.text}")
    return tokens_of(response.json(), model, max_tokens)


def cached_tokens(body: dict) -> int:
    return (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def tokens_of(body: dict, model: str, max_tokens: int) -> tuple[list[str], str]:
    choice = body["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    ensure(len(tokens) == max_tokens == body["usage"]["completion_tokens"],
           f"model={model!r}: {len(tokens)} tokens, usage {body['usage']}, wanted {max_tokens}")
    ensure(choice["finish_reason"] == "length", f"model={model!r}: finish_reason {choice['finish_reason']!r}")
    return tokens, choice["text"]


def load(http: httpx.Client, name: str, path: Path | str, **extra: object) -> httpx.Response:
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra})


def unload(http: httpx.Client, name: str) -> httpx.Response:
    return http.post("/v1/unload_lora_adapter", json={"lora_name": name})


def cards(http: httpx.Client) -> dict[str, dict]:
    response = http.get("/v1/models")
    ensure(response.status_code == 200, f"GET /v1/models: {response.status_code} {response.text}")
    return {c["id"]: c for c in response.json()["data"]}


def error_message(response: httpx.Response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text


def still_serves(http: httpx.Client, model: str, prompt: list[int], after: str) -> None:
    response = complete(http, model, prompt, 2)
    ensure(response.status_code == 200,
           f"after {after}, a request on {model!r} got {response.status_code} {response.text}")


def read_sse(response: httpx.Response) -> list[dict]:
    return read_sse_lines(response.iter_lines())


def read_sse_lines(lines) -> list[dict]:
    """Every `data:` event of an SSE stream's lines, up to [DONE] (which must come, and end it)."""
    events, done = [], False
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        ensure(not done, f"an event after [DONE]: {line!r}")
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    ensure(done, f"the stream ended without [DONE] after {len(events)} events")
    return events


# ----------------------------------------------------------------------------------------------------- tests


def test_models_list_the_base_and_the_adapter_with_parent_and_root(http, base_name, files):
    listed = cards(http)
    ensure(set(listed) == {base_name, "a"}, f"/v1/models lists {sorted(listed)}, wanted the base and 'a'")
    a = listed["a"]
    ensure(a["parent"] == base_name, f"adapter a's parent is {a['parent']!r}, wanted {base_name!r}")
    ensure(Path(a["root"]) == files["a"], f"adapter a's root is {a['root']!r}, wanted {files['a']}")
    ensure(a["object"] == "model", f"adapter card {a}")
    one = http.get("/v1/models/a")
    ensure(one.status_code == 200 and one.json()["parent"] == base_name, f"GET /v1/models/a: {one.text}")


def test_metrics_count_requests_per_adapter(http, base_name, prompt):
    ensure(complete(http, "a", prompt).status_code == 200, "a request on adapter a")
    text = http.get("/metrics").text
    ensure('infer:lora_adapters_loaded{model_name="%s"} 1' % base_name in text, "/metrics counts the loaded adapter")
    ensure('infer:lora_requests_info{running_lora_adapters="",waiting_lora_adapters="",max_lora="2"} 1' in text,
           "/metrics has vLLM's lora_requests_info with max_lora")
    ensure("# TYPE infer:lora_requests_running gauge" in text, "/metrics has the per-adapter running gauge")


def test_greedy_tokens_equal_transformers_peft(http, base_name, files, prompt, tokenizer):
    with_a = served_tokens(http, "a", prompt)
    without = served_tokens(http, base_name, prompt)
    want_a = greedy_reference(files, "a", prompt, tokenizer)
    want_base = greedy_reference(files, None, prompt, tokenizer)
    ensure(want_a != want_base, f"adapter a should change the greedy tokens of this prompt: {want_a}")
    ensure(with_a == want_a, f"model='a' served {with_a}, transformers+peft greedy gives {want_a}")
    ensure(without == want_base, f"the base model served {without}, transformers gives {want_base}")


def test_prefix_cache_is_per_adapter(http, base_name, files, long_prompt, tokenizer):
    """A prompt's KV computed under one model is never read by another: the base's cached blocks are not a's (and
    a's own are), and each answer is still transformers + peft's."""
    want = {m: greedy_reference(files, m, long_prompt, tokenizer) for m in (None, "a")}
    first = complete(http, base_name, long_prompt)
    again = complete(http, base_name, long_prompt)
    ensure(cached_tokens(again.json()) >= 32,
           f"the base's second request should read the cache: {again.json()['usage']}")
    on_a = complete(http, "a", long_prompt)
    ensure(cached_tokens(on_a.json()) == 0, f"a's first request read the base's cached KV: {on_a.json()['usage']}")
    on_a_again = complete(http, "a", long_prompt)
    ensure(cached_tokens(on_a_again.json()) >= 32, f"a's second request should read a's cache: "
                                                   f"{on_a_again.json()['usage']}")
    for label, response, model in (("first", first, None), ("cached", again, None), ("first", on_a, "a"),
                                   ("cached", on_a_again, "a")):
        got = tokens_of(response.json(), model or base_name, MAX_TOKENS)
        ensure(got == want[model],
               f"{label} request on {model or base_name!r} served {got}, the reference {want[model]}")


def test_streamed_chat_on_the_adapter(http, base_name, files, tokenizer):
    """Every SSE chunk of a streamed chat on `a` read: one finish, usage, the whole answer's text, which is the
    transformers + peft greedy continuation of the conversation the chat template renders."""
    body = {"model": "a", "messages": [{"role": "user", "content": "yes or no?"}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    whole = http.post("/v1/chat/completions", json={**body, "stream": False, "stream_options": None})
    ensure(whole.status_code == 200, f"chat with model='a': {whole.status_code} {whole.text}")
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        ensure(response.status_code == 200, f"streamed chat with model='a': {response.status_code} {response.read()}")
        events = read_sse(response)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in events if c["choices"] and c["choices"][0]["finish_reason"]]
    ensure(finishes == ["length"], f"streamed chat finish reasons {finishes}")
    ensure(events[-1]["usage"]["completion_tokens"] == MAX_TOKENS, f"the stream's usage: {events[-1].get('usage')}")
    ensure(text == whole.json()["choices"][0]["message"]["content"],
           f"the streamed chat text {text!r} differs from the whole one {whole.json()['choices'][0]['message']!r}")
    rendered = tokenizer.encode("user: yes or no?\nassistant:", add_special_tokens=False)
    want = tokenizer.decode(greedy_reference_ids(files, "a", rendered), skip_special_tokens=True)
    ensure(text == want, f"the streamed chat on 'a' says {text!r}; transformers+peft greedy says {want!r}")
    base = http.post("/v1/chat/completions", json={**body, "model": base_name, "stream": False, "stream_options": None})
    ensure(base.status_code == 200, f"chat on the base: {base.status_code} {base.text}")


def test_load_and_unload_at_run_time(http, base_name, files, prompt, long_prompt, tokenizer):
    loaded = load(http, "b", files["b"])
    try:
        ensure(loaded.status_code == 200, f"loading b: {loaded.status_code} {loaded.text}")
        listed = cards(http)
        ensure(set(listed) == {base_name, "a", "b"}, f"after loading b, /v1/models lists {sorted(listed)}")
        ensure(listed["b"]["parent"] == base_name and Path(listed["b"]["root"]) == files["b"],
               f"b's card: {listed['b']}")
        with_b = served_tokens(http, "b", prompt)
        ensure(with_b != served_tokens(http, base_name, prompt), f"model='b' answered as the base: {with_b}")
        want_b = greedy_reference(files, "b", prompt, tokenizer)
        ensure(with_b == want_b, f"model='b' served {with_b}, transformers+peft greedy gives {want_b}")
        long_b = served_tokens(http, "b", long_prompt)  # its blocks now cached under b
    finally:
        unloaded = unload(http, "b")
    ensure(unloaded.status_code == 200, f"unloading b: {unloaded.status_code} {unloaded.text}")
    listed = cards(http)
    ensure(set(listed) == {base_name, "a"}, f"after unloading b, /v1/models lists {sorted(listed)}")
    gone = complete(http, "b", prompt)
    ensure(gone.status_code == 404, f"a request naming the unloaded b: {gone.status_code} {gone.text}")
    ensure(gone.json()["error"]["code"] == "model_not_found", f"unloaded b: {gone.text}")
    unknown = unload(http, "never-loaded")
    ensure(unknown.status_code == 404 and "never-loaded" in error_message(unknown),
           f"unloading an unknown name: {unknown.status_code} {unknown.text}")
    reloaded = load(http, "b", files["b"])  # the same name again, after its unload: served afresh
    try:
        ensure(reloaded.status_code == 200, f"loading b again: {reloaded.status_code} {reloaded.text}")
        ensure(served_tokens(http, "b", prompt) == with_b, "b loaded again answers differently")
    finally:
        unload(http, "b")
    # the name again for another adapter (b2's weights): neither the prefix cache of the same prompt under the old b
    # nor a host or device copy of the old b's weights may answer for it
    renamed = load(http, "b", files["b2"])
    try:
        ensure(renamed.status_code == 200, f"loading b2's adapter as b: {renamed.status_code} {renamed.text}")
        ensure(Path(cards(http)["b"]["root"]) == files["b2"], f"b's card after reloading it: {cards(http)['b']}")
        want_b2 = greedy_reference(files, "b2", long_prompt, tokenizer)
        ensure(want_b2 != long_b, "b2 should answer the long prompt differently from b")
        response = complete(http, "b", long_prompt)
        ensure(cached_tokens(response.json()) == 0, f"the new b read the old b's cached KV: {response.json()['usage']}")
        got = tokens_of(response.json(), "b", MAX_TOKENS)
        ensure(got == want_b2, f"b reloaded with b2's weights served {got}; transformers+peft with b2 gives "
                               f"{want_b2} (the old b's answer: {long_b})")
    finally:
        unload(http, "b")


@pytest.mark.parametrize("case, status, says", [
    ("missing", 400, "not a directory"),
    ("no_config", 400, "adapter_config.json is missing"),
    ("corrupt", 400, "cannot be read as safetensors"),
    ("rank32", 400, "above --max-lora-rank 16"),
    ("other_hidden", 400, "another base model"),
    ("other_layers", 400, "the base model has 3 layers"),
    ("fc1", 400, "target module 'fc1' is not supported"),
    ("lm_head", 400, "lm_head"),
    ("dora", 400, "use_dora"),
    ("duplicate", 400, "already loaded"),
    ("base_name", 400, "base model"),
    ("extra_field", (400, 422), "color"),
    ("no_path", (400, 422), "lora_path"),
])
def test_bad_loads_are_refused_and_the_server_keeps_serving(http, base_name, files, prompt, case, status, says):
    if case == "missing":
        response = load(http, "bad", files["base"].parent / "does-not-exist")
    elif case == "duplicate":
        response = load(http, "a", files["b"])
    elif case == "base_name":
        response = load(http, base_name, files["b"])
    elif case == "extra_field":
        response = load(http, "bad", files["b"], color="red")
    elif case == "no_path":
        response = http.post("/v1/load_lora_adapter", json={"lora_name": "bad"})
    else:
        response = load(http, "bad", files[case])
    try:
        wanted = status if isinstance(status, tuple) else (status,)
        ensure(response.status_code in wanted, f"load of {case}: {response.status_code} {response.text}, "
                                               f"wanted {status}")
        ensure(says in error_message(response), f"load of {case}: the message {error_message(response)!r} "
                                                f"should say {says!r}")
        ensure(response.json()["error"]["type"] == "invalid_request_error",
               f"load of {case}: error body {response.text}")
    finally:
        if "bad" in cards(http):
            unload(http, "bad")
    listed = cards(http)
    ensure(set(listed) == {base_name, "a"}, f"after the refused load of {case}, /v1/models lists {sorted(listed)}")
    ensure(Path(listed["a"]["root"]) == files["a"], f"after the refused load of {case}, a's card {listed['a']}")
    still_serves(http, "a", prompt, f"the refused load of {case}")
    still_serves(http, base_name, prompt, f"the refused load of {case}")


def test_load_and_unload_while_requests_stream(http, server, base_name, files, prompt):
    """Streams on a, on the base and on b run while b is unloaded and c loaded, used (it waits for a device slot:
    a and b hold both) and unloaded: every stream reads to its end (nothing lost, b's too: a request already running
    keeps its adapter), each with the text it gets alone."""
    max_tokens = 160
    loaded = load(http, "b", files["b"])
    ensure(loaded.status_code == 200, f"loading b: {loaded.status_code} {loaded.text}")
    models = ["a", base_name, "b", "a"]

    def whole(model: str, tokens: int) -> str:
        response = http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": tokens,
                                                      "temperature": 0, "ignore_eos": True})
        ensure(response.status_code == 200, f"completion on {model!r}: {response.status_code} {response.text}")
        return response.json()["choices"][0]["text"]

    alone = {m: whole(m, max_tokens) for m in set(models)}
    started = [threading.Event() for _ in models]

    def stream(i: int, model: str) -> tuple[str, list, dict]:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        events, done = [], False
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                ensure(response.status_code == 200, f"stream {i} on {model!r}: {response.status_code}")
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    ensure(not done, f"stream {i}: an event after [DONE]: {line!r}")
                    if line == "data: [DONE]":
                        done = True
                        continue
                    events.append(json.loads(line.removeprefix("data: ")))
                    if len(events) == 3:
                        started[i].set()
        started[i].set()
        ensure(done, f"stream {i} on {model!r} ended without [DONE] after {len(events)} events")
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        finishes = [e["choices"][0]["finish_reason"] for e in events
                    if e["choices"] and e["choices"][0]["finish_reason"]]
        return text, finishes, events[-1].get("usage") or {}

    try:
        with ThreadPoolExecutor(len(models)) as pool:
            futures = [pool.submit(stream, i, m) for i, m in enumerate(models)]
            for i, event in enumerate(started):
                ensure(event.wait(120), f"stream {i} never sent its first chunks")
            unloaded = unload(http, "b")
            streaming = [not f.done() for f in futures]
            ensure(unloaded.status_code == 200, f"unloading b mid-stream: {unloaded.status_code} {unloaded.text}")
            loaded = load(http, "c", files["c"])
            ensure(loaded.status_code == 200, f"loading c mid-stream: {loaded.status_code} {loaded.text}")
            on_c = http.post("/v1/completions", json={"model": "c", "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                      "temperature": 0, "ignore_eos": True})
            ensure(on_c.status_code == 200, f"a request on c while the others stream: {on_c.status_code} {on_c.text}")
            unloaded_c = unload(http, "c")
            ensure(unloaded_c.status_code == 200, f"unloading c mid-stream: {unloaded_c.status_code} {unloaded_c.text}")
            results = [f.result(timeout=180) for f in futures]
    finally:
        for name in ("b", "c"):
            if name in cards(http):
                unload(http, name)
    ensure(any(streaming), "every stream had ended before b was unloaded: the test did not overlap them (raise "
                           "max_tokens)")
    for i, (model, (text, finishes, usage)) in enumerate(zip(models, results)):
        ensure(finishes == ["length"], f"stream {i} on {model!r} finished with {finishes}")
        ensure(usage.get("completion_tokens") == max_tokens, f"stream {i} on {model!r}: usage {usage}")
        ensure(text == alone[model], f"stream {i} on {model!r} streamed {text!r}, alone it gives {alone[model]!r}")
    ensure(set(cards(http)) == {base_name, "a"}, f"after the streams, /v1/models lists {sorted(cards(http))}")
    c_alone = load(http, "c", files["c"])
    try:
        ensure(c_alone.status_code == 200, f"loading c again: {c_alone.status_code} {c_alone.text}")
        ensure(on_c.json()["choices"][0]["text"] == whole("c", MAX_TOKENS),
               "the request on c sent while the others streamed differs from c alone")
    finally:
        unload(http, "c")


def test_concurrent_loads_and_unloads_of_one_name(server, base_name, files, prompt):
    """Loads of one name from two paths sent at once: one wins (200), the other is refused (400: already loaded);
    unloads of one name sent at once: one removes it (200), every other is the 404 model_not_found a later unload
    gets, whichever of them reached the engine first."""

    async def race(route: str, bodies: list[dict]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            return list(await asyncio.gather(*(client.post(route, json=body) for body in bodies)))

    loads = asyncio.run(race("/v1/load_lora_adapter", [{"lora_name": "x", "lora_path": str(files[k])}
                                                       for k in ("b", "b2")]))
    try:
        statuses = sorted(r.status_code for r in loads)
        ensure(statuses == [200, 400], f"two loads of x at once: {[(r.status_code, r.text) for r in loads]}")
        winner = files["b"] if loads[0].status_code == 200 else files["b2"]
        loser = next(r for r in loads if r.status_code == 400)
        ensure("already loaded" in error_message(loser), f"the refused load of x says {error_message(loser)!r}")
        with httpx.Client(base_url=server.base_url, timeout=60) as http:
            ensure(Path(cards(http)["x"]["root"]) == winner, f"x's card {cards(http)['x']}, the winner {winner}")
            still_serves(http, "x", prompt, "two loads of x at once")
    finally:
        unloads = asyncio.run(race("/v1/unload_lora_adapter", [{"lora_name": "x"}] * 3))
    statuses = [r.status_code for r in unloads]
    ensure(sorted(statuses) == [200, 404, 404],
           f"three unloads of x at once: {[(r.status_code, r.text) for r in unloads]} (wanted one 200, two 404)")
    for r in unloads:
        if r.status_code == 404:
            ensure(r.json()["error"]["code"] == "model_not_found", f"an unload of x that lost the race: {r.text}")
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        ensure(set(cards(http)) == {base_name, "a"}, f"after the races, /v1/models lists {sorted(cards(http))}")


def test_responses_name_the_adapter_they_ran(http, base_name, prompt):
    """As vLLM (and OpenAI: `model` is the model that answered): a response's `model` is the adapter's name."""
    for model in ("a", base_name):
        response = complete(http, model, prompt, 2)
        ensure(response.status_code == 200, f"completion on {model!r}: {response.status_code} {response.text}")
        ensure(response.json()["model"] == model, f"a completion on {model!r} says model={response.json()['model']!r}")
        chat = http.post("/v1/chat/completions", json={"model": model, "max_tokens": 2,
                                                       "messages": [{"role": "user", "content": "hi"}]})
        ensure(chat.status_code == 200, f"chat on {model!r}: {chat.status_code} {chat.text}")
        ensure(chat.json()["model"] == model, f"a chat completion on {model!r} says model={chat.json()['model']!r}")


def test_mixed_adapters_concurrently_answer_as_alone(http, server, base_name, files, prompt, tokenizer):
    """Three adapters and the base at once with two device slots (and two host copies): each request's greedy
    tokens are the ones it gets alone, and the adapters' are transformers + peft's."""
    for name in ("b2", "c"):
        loaded = load(http, name, files[name])
        ensure(loaded.status_code == 200, f"loading {name}: {loaded.status_code} {loaded.text}")
    try:
        models = ["a", "b2", "c", base_name]
        alone = {m: served_tokens(http, m, prompt) for m in models}
        for name in ("b2", "c"):
            want = greedy_reference(files, name, prompt, tokenizer)
            ensure(alone[name] == want, f"model={name!r} served {alone[name]}, transformers+peft gives {want}")
        ensure(len({tuple(tokens) for tokens, _ in alone.values()}) == len(models),
               f"the four models should differ: {alone}")

        def one(model: str) -> tuple[list[str], str]:
            with httpx.Client(base_url=server.base_url, timeout=120) as client:
                return served_tokens(client, model, prompt)

        order = models * 3
        with ThreadPoolExecutor(len(order)) as pool:
            together = list(pool.map(one, order))
        for model, tokens in zip(order, together):
            ensure(tokens == alone[model], f"model={model!r} sent with the others gave {tokens}, alone {alone[model]}")
    finally:
        for name in ("b2", "c"):
            unload(http, name)
    ensure(set(cards(http)) == {base_name, "a"}, f"after the mixed test, /v1/models lists {sorted(cards(http))}")


def test_unknown_adapter_is_404_model_not_found(http, prompt):
    for route, body in (("/v1/completions", {"prompt": prompt}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        response = http.post(route, json={"model": "nope", "max_tokens": 2, **body})
        ensure(response.status_code == 404, f"{route} with model='nope': {response.status_code} {response.text}")
        error = response.json()["error"]
        ensure(error["code"] == "model_not_found" and "nope" in error["message"], f"{route}: {error}")


def test_server_without_enable_lora_refuses_loads(files):
    with serve_process("--model", str(files["base"]), *SERVE_FLAGS) as served:
        with httpx.Client(base_url=served.base_url, timeout=60) as client:
            for route, body in (("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(files["a"])}),
                                ("/v1/unload_lora_adapter", {"lora_name": "a"})):
                response = client.post(route, json=body)
                ensure(response.status_code == 400, f"{route} without --enable-lora: {response.status_code} "
                                                    f"{response.text}")
                ensure("not enabled" in error_message(response) and "--enable-lora" in error_message(response),
                       f"{route} without --enable-lora: {error_message(response)!r}")
            listed = client.get("/v1/models").json()["data"]
            ensure(len(listed) == 1 and listed[0]["parent"] is None, f"/v1/models without LoRA: {listed}")
            named = client.post("/v1/completions", json={"model": "a", "prompt": "hi", "max_tokens": 2})
            ensure(named.status_code == 404, f"model='a' without --enable-lora: {named.status_code} {named.text}")
