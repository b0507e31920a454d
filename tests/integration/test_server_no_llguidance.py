"""A tokenizer llguidance cannot read (`"decoder": null` in tokenizer.json) still serves: plain requests work, and
structured-output and tool requests are a 400 that says why."""

from __future__ import annotations

import json

import httpx
import pytest

from checkpoints import save_tiny_llama3_chat
from server_harness import MODEL, running_server

pytestmark = pytest.mark.slow

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = save_tiny_llama3_chat(tmp_path_factory.mktemp("no_decoder"))
    spec = json.loads((path / "tokenizer.json").read_text())
    spec["decoder"] = None
    (path / "tokenizer.json").write_text(json.dumps(spec))
    with running_server(path, device="cpu", dtype="float32", max_seq_len=2048) as running:
        yield running


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": MODEL, **body}, timeout=60)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "response_format": {"type": "json_object"}},
     "response_format"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "tools": [TOOL], "tool_choice": "required"}, "tools"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "guided_regex": "a+"}, "guided_regex"),
])
def test_structured_requests_are_a_400_saying_why_and_plain_ones_are_served(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "llguidance cannot read its tokenizer" in err["message"] and err["param"].startswith(param.split(".")[0])
    for plain in ({"prompt": "Hi", "max_tokens": 2}, {"messages": CHAT, "max_tokens": 2}):
        route = "/v1/completions" if "prompt" in plain else "/v1/chat/completions"
        assert _post(server, route, plain).status_code == 200
