"""A tiny Llama served with the Llama 3 template, through the openai client: Llama 3.1's JSON tool calls forced,
parsed, streamed, answered from an ipython turn, and auto mode giving text or valid calls."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from checkpoints import save_tiny_llama3_chat
from server_harness import MODEL, running_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer",
                                                                                           "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = save_tiny_llama3_chat(tmp_path_factory.mktemp("llama3") / "model", seed=5)
    with running_server(path, device="cpu", dtype="float32", max_seq_len=2048, max_batch_size=8) as server:
        assert server.state.built.chat_template_name == "llama3"
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _valid(call) -> tuple[str, dict]:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    return call.function.name, arguments


@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_whole_and_streamed(client, parallel):
    body = dict(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=parallel,
                seed=3, temperature=0.8, max_tokens=150)
    whole = client.chat.completions.create(**body).choices[0]
    calls = [_valid(c) for c in whole.message.tool_calls or []]
    if whole.finish_reason == "tool_calls":
        assert calls and whole.message.content is None
    else:  # calls joined by "; " until max_tokens: the cut-off answer stays text
        assert parallel and whole.finish_reason == "length" and not calls and whole.message.content.startswith("{")
    streamed, content, finish = {}, "", None
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                entry = streamed.setdefault(tc.index, [tc.function.name, ""])
                entry[1] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert [(name, json.loads(arguments)) for name, arguments in streamed.values()] == calls
    assert finish == whole.finish_reason and (content or None) == whole.message.content


def test_two_turn_conversation_with_an_ipython_result(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], parallel_tool_calls=False,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                           seed=1, max_tokens=80)
    [call] = first.choices[0].message.tool_calls
    _valid(call)
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    for seed in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], seed=seed,
                                               max_tokens=40)
        message = reply.choices[0].message
        for c in message.tool_calls or []:
            _valid(c)
        assert message.content is not None or message.tool_calls
