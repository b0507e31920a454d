"""Options users carry over from vLLM, on a real server: a chat template file rendered instead of the family's
(`--chat-template`), and a generation config's sampling defaults for requests that leave them out
(`--generation-config`)."""

from __future__ import annotations

import json

import httpx
import pytest

from server_harness import MODEL, running_server

pytestmark = pytest.mark.slow

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def configured(smollm2_gguf, tmp_path_factory):
    folder = tmp_path_factory.mktemp("options")
    (folder / "plain.jinja").write_text(TEMPLATE)
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_k": 5, "do_sample": True}))
    with running_server(smollm2_gguf, max_seq_len=512, chat_template=str(folder / "plain.jinja"),
                        generation_config=str(folder)) as running:
        yield running


def test_the_chat_template_file_renders_the_prompt(configured):
    base = configured.base_url
    expected = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = httpx.post(f"{base}/tokenize", json={"messages": ASK}).json()["tokens"]
    assert ids == configured.state.built.tokenizer.encode(expected, add_special_tokens=False)
    assert httpx.get(f"{base}/tokenizer_info").json()["chat_template"] == TEMPLATE
    reply = httpx.post(f"{base}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4}, timeout=60)
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == len(ids)


def test_generation_config_defaults_apply_where_a_request_leaves_them_out(configured):
    base = configured.base_url
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12}
    greedy = httpx.post(f"{base}/v1/completions", json=body | {"temperature": 0}, timeout=60).json()["choices"][0]
    defaulted = httpx.post(f"{base}/v1/completions", json=body | {"n": 3}, timeout=60).json()["choices"]
    assert [c["text"] for c in defaulted] == [greedy["text"]] * 3  # temperature 0 from the file
    sampled = httpx.post(f"{base}/v1/completions", json=body | {"n": 3, "temperature": 1.5, "top_k": 0, "seed": 3},
                         timeout=60).json()["choices"]
    assert len({c["text"] for c in sampled}) > 1  # the request's own fields win
