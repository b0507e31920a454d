"""A tiny Qwen 3 served with the Qwen 3 template, through the openai client: Hermes tool calls in a two-turn
conversation, the <think> block split into reasoning_content (streamed and whole), enable_thinking=false,
and output constraints that apply to the answer after the reasoning block."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from checkpoints import save_tiny_qwen3_chat
from server_harness import MODEL, running_server

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
# the answer a grammar forces (<think> and </think> are single tokens: llguidance names them, unquoted)
THOUGHT = 'start: <think> "\\nThe cat sat.\\n" </think> "\\n\\nyes no"'


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = save_tiny_qwen3_chat(tmp_path_factory.mktemp("qwen3") / "model", seed=3)
    with running_server(path, device="cpu", dtype="float32", max_seq_len=2048, max_batch_size=8) as server:
        yield server


@pytest.fixture()
def client(qwen3):
    return openai.OpenAI(base_url=f"{qwen3.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _think_id(qwen3) -> int:
    return qwen3.state.built.tokenizer.encode("<think>", add_special_tokens=False)[0]


def test_two_turn_tool_conversation(client):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           parallel_tool_calls=False, seed=1, max_tokens=80, extra_body=NO_THINKING)
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    messages = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    for stream in (False, True):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="auto",
                                               seed=2, max_tokens=40, extra_body=NO_THINKING, stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
            assert "<tool_call>" not in text or "</tool_call>" not in text
        else:
            message = reply.choices[0].message
            for c in message.tool_calls or []:
                jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])


def test_reasoning_goes_to_reasoning_content_whole_and_streamed(client):
    body = dict(model=MODEL, messages=ASK, max_tokens=40,
                extra_body={"guided_grammar": THOUGHT})
    message = client.chat.completions.create(**body).choices[0].message
    assert (message.reasoning_content, message.content) == ("The cat sat.", "yes no")
    reasoning = content = ""
    for chunk in client.chat.completions.create(**body, stream=True):
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    assert (reasoning, content) == ("The cat sat.", "yes no")


def test_cut_off_reasoning_is_all_reasoning(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4,
                                           extra_body={"guided_grammar": THOUGHT})
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "length" and message.content == ""
    assert "The cat sat.".startswith(message.reasoning_content)


def test_enable_thinking_false_renders_the_empty_think_block(client, qwen3):
    tokenizer = qwen3.state.built.tokenizer
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    off = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, extra_body=NO_THINKING)
    empty = tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    assert off.usage.prompt_tokens - plain.usage.prompt_tokens == len(empty)
    assert qwen3.state.built.render_chat(ASK, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_reasoning_effort_none_turns_thinking_off(client):
    """OpenAI's reasoning_effort on Qwen 3: none and minimal render the empty think block, the others do not."""
    def prompt_tokens(effort: str) -> int:
        reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, reasoning_effort=effort)
        return reply.usage.prompt_tokens

    off = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1, extra_body=NO_THINKING)
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
    assert prompt_tokens("none") == prompt_tokens("minimal") == off.usage.prompt_tokens
    assert prompt_tokens("low") == prompt_tokens("high") == plain.usage.prompt_tokens < off.usage.prompt_tokens


@pytest.mark.parametrize("thinking", [True, False])
def test_constraints_apply_to_the_answer_after_the_reasoning(client, qwen3, thinking):
    """With thinking on the grammar allows a <think> block first (banned here, so the answer comes at once)."""
    extra = {"logit_bias": {str(_think_id(qwen3)): -100}} | ({} if thinking else NO_THINKING)
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
              "additionalProperties": False}
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=40, seed=3, extra_body=extra,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    call = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                          parallel_tool_calls=False, max_tokens=80, seed=4, extra_body=extra)
    [c] = call.choices[0].message.tool_calls
    jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
