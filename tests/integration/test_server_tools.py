"""Tool calling through the official openai client against the server on the bundled SmolLM2: forced calls always
valid under their schemas, a two-turn conversation, streamed and whole calls equal, pydantic tools, errors by name."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from server_harness import MODEL

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
SCHEMAS = [  # varied shapes: nested objects, enums, arrays, required fields, numbers
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
     "additionalProperties": False},
    {"type": "object", "properties": {"place": {"type": "object", "properties": {
        "country": {"type": "string", "enum": ["FR", "DE", "JP"]}, "zip": {"type": "integer", "minimum": 0, "maximum": 99999}},
        "required": ["country", "zip"], "additionalProperties": False}}, "required": ["place"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                               "minItems": 1, "maxItems": 3}}, "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"mode": {"enum": ["fast", "slow"]}, "count": {"type": "integer", "minimum": 1, "maximum": 9},
                                      "ok": {"type": "boolean"}}, "required": ["mode", "count", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"points": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99}, "y": {"type": "boolean"}},
        "required": ["x", "y"],
        "additionalProperties": False}}}, "required": ["points"], "additionalProperties": False},
]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _tool(i: int, schema: dict) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "description": "does something", "parameters": schema}}


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_two_turn_weather_conversation_required_then_auto(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, temperature=0, max_tokens=60)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages = [*ASK, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto",
                                            temperature=0, max_tokens=40)
    answer = second.choices[0]
    assert answer.message.content or answer.message.tool_calls
    for name, arguments in _calls(answer.message):
        assert name == "get_weather"
        jsonschema.validate(arguments, WEATHER["function"]["parameters"])


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_forced_calls_validate_over_seeded_runs(client, index):
    """10 seeded choices per schema (50 runs in all), required and named: every call's arguments validate."""
    tools = [_tool(i, s) for i, s in enumerate(SCHEMAS)]
    choice = "required" if index % 2 else {"type": "function", "function": {"name": f"tool_{index}"}}
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=tools, tool_choice=choice, n=10,
                                           seed=100 + index, temperature=1.0, max_tokens=200,
                                           parallel_tool_calls=False)
    for c in reply.choices:
        assert c.finish_reason == "tool_calls", c
        [(name, arguments)] = _calls(c.message)
        if isinstance(choice, dict):
            assert name == f"tool_{index}"
        jsonschema.validate(arguments, SCHEMAS[int(name.split("_")[1])])


@pytest.mark.parametrize("parallel", [None, True])
def test_a_named_tool_choice_gives_exactly_one_call(client, parallel):
    """SmolLM2 repeats a call until max_tokens where several are allowed: a named choice stops after one, whatever
    parallel_tool_calls says (absent, OpenAI's default is true)."""
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    for stream in (False, True):
        body = dict(model=MODEL, messages=ASK, tools=[WEATHER, _tool(1, SCHEMAS[0])], n=3, seed=11, temperature=1.0,
                    max_tokens=200, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **extra)
        if stream:
            with client.chat.completions.stream(**body) as events:
                choices = events.get_final_completion().choices
        else:
            choices = client.chat.completions.create(**body).choices
        for c in choices:
            assert c.finish_reason == "tool_calls" and [name for name, _ in _calls(c.message)] == ["get_weather"]


def test_streamed_and_whole_calls_are_the_same(client):
    body = dict(model=MODEL, messages=ASK, tools=[WEATHER, _tool(1, SCHEMAS[1])], tool_choice="required", seed=7,
                temperature=0.9, max_tokens=120, parallel_tool_calls=False)
    whole = client.chat.completions.create(**body).choices[0]
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            delta = c.delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == whole.finish_reason == "tool_calls"
    assert "<tool_call>" not in content and not content.strip()
    assert [(e["name"], json.loads(e["arguments"])) for e in calls.values()] == _calls(whole.message)
    with client.chat.completions.stream(**body) as stream:  # the client's own reassembly
        final = stream.get_final_completion()
    assert _calls(final.choices[0].message) == _calls(whole.message)


class Weather(BaseModel):
    city: str
    unit: str


def test_parse_with_pydantic_function_tool(client):
    reply = client.chat.completions.parse(model=MODEL, messages=ASK, tools=[openai.pydantic_function_tool(Weather)],
                                          tool_choice="required", parallel_tool_calls=False, temperature=0,
                                          max_tokens=60)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "Weather" and isinstance(call.function.parsed_arguments, Weather)


def test_tool_choice_none_gives_text(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=12)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_auto_never_fails_and_gives_text_or_valid_calls(client):
    for seed in range(4):
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], seed=seed, temperature=1.0,
                                               max_tokens=40)
        message = reply.choices[0].message
        for name, arguments in _calls(message):
            jsonschema.validate(arguments, WEATHER["function"]["parameters"])
        assert message.content is not None or message.tool_calls


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [_tool(0, {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}})],
      "tool_choice": "required"}, "tools.0.function.parameters"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
])
def test_bad_tool_requests_are_400s_naming_the_field(server, extra, param):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "messages": ASK, "max_tokens": 4} | extra,
                   timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_history_arguments_are_a_400(server):
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{not json"}}]}]
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "messages": messages, "tools": [WEATHER]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.tool_calls.0.function.arguments"
