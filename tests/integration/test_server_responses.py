"""POST /v1/responses through the official openai client on the bundled SmolLM2 (and a tiny Qwen 3): plain, streamed
(typed events in order, deltas joining to the final text), function tools and their outputs fed back,
previous_response_id, text.format, GET by id, and the errors that name a field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response

from checkpoints import save_tiny_qwen3_chat
from server_harness import MODEL, running_server

pytestmark = pytest.mark.slow

ASK = "What is the capital of France?"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
GREEDY = {"model": MODEL, "temperature": 0}


def _prompt_tokens(server, messages: list[dict], **extra: object) -> int:
    body = {"messages": messages, **extra}
    return len(httpx.post(f"{server.base_url}/tokenize", json=body).json()["tokens"])


def test_plain_response_is_the_chat_answer(client, server):
    reply = client.responses.create(input=ASK, instructions="Be brief.", max_output_tokens=12, **GREEDY)
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == MODEL
    [message] = reply.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}]
    chat = client.chat.completions.create(messages=messages, max_tokens=12, **GREEDY)
    assert reply.output_text == chat.choices[0].message.content
    assert reply.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if reply.status == "incomplete":
        assert reply.incomplete_details.reason == "max_output_tokens"
    usage = reply.usage
    assert usage.input_tokens == chat.usage.prompt_tokens == _prompt_tokens(server, messages)
    assert usage.output_tokens == chat.usage.completion_tokens
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0 and usage.input_tokens_details.cached_tokens >= 0
    assert (reply.max_output_tokens, reply.temperature, reply.top_p, reply.store) == (12, 0, 1.0, True)
    assert reply.tool_choice == "auto" and reply.tools == [] and reply.parallel_tool_calls
    assert reply.instructions == "Be brief." and reply.previous_response_id is None


def test_stream_events_in_order_join_to_the_final_text(client):
    whole = client.responses.create(input=ASK, max_output_tokens=12, **GREEDY)
    events = list(client.responses.create(input=ASK, max_output_tokens=12, stream=True, **GREEDY))
    kinds = [e.type for e in events]
    final = "response.completed" if whole.status == "completed" else "response.incomplete"
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *[d.type for d in deltas], "response.output_text.done",
                     "response.content_part.done", "response.output_item.done", final]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    text = "".join(d.delta for d in deltas)
    assert text == events[-4].text == events[-2].item.content[0].text == whole.output_text
    response = events[-1].response
    assert response.output_text == text and response.usage.output_tokens == whole.usage.output_tokens
    assert response.id == events[0].response.id and response.status == whole.status


def test_required_function_call_then_its_output_fed_back(client, server):
    first = client.responses.create(input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=40, **GREEDY)
    assert first.status == "completed" and first.output_text == ""
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required"
    streamed = list(client.responses.create(input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                            parallel_tool_calls=False, max_output_tokens=40, stream=True, **GREEDY))
    kinds = [e.type for e in streamed]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert streamed[4].arguments == call.arguments == streamed[-1].response.output[0].arguments
    feedback = [{"role": "user", "content": "Weather in Paris?"}, *first.output,
                {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}]
    second = client.responses.create(input=feedback, tools=[WEATHER], tool_choice="none", max_output_tokens=16,
                                     **GREEDY)
    assert second.output[0].type == "message" and second.output_text
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                    "name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": '{"temperature": 21}'}]
    assert second.usage.input_tokens == _prompt_tokens(server, messages)  # tool_choice none: no tools rendered


def test_previous_response_id_continues_the_conversation(client, server):
    first = client.responses.create(input="My name is Ada.", instructions="Be brief.", max_output_tokens=8, **GREEDY)
    second = client.responses.create(input="What is my name?", previous_response_id=first.id, max_output_tokens=8,
                                     **GREEDY)
    assert second.previous_response_id == first.id
    messages = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": "What is my name?"}]  # instructions are not carried over
    assert second.usage.input_tokens == _prompt_tokens(server, messages)
    third = client.responses.create(input=[{"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "And again?"}]}],
                                    previous_response_id=second.id, max_output_tokens=4, **GREEDY)
    messages += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "And again?"}]
    assert third.usage.input_tokens == _prompt_tokens(server, messages)


def test_text_format_json_schema_gives_valid_json(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "population": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = client.responses.create(input=ASK, max_output_tokens=60, temperature=0, model=MODEL,
                                    text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                     "strict": True}})
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), schema)
    assert reply.text.format.type == "json_schema" and reply.text.format.name == "city"


def test_get_returns_the_stored_response_and_unknown_ids_are_404(client, server):
    made = client.responses.create(input=ASK, max_output_tokens=4, metadata={"run": "1"}, user="me", **GREEDY)
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump() and got.metadata == {"run": "1"}
    Response.model_validate(httpx.get(f"{server.base_url}/v1/responses/{made.id}").json())  # every field the SDK has
    unstored = client.responses.create(input=ASK, max_output_tokens=4, store=False, **GREEDY)
    assert unstored.store is False
    for missing in (unstored.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.retrieve(missing)
        assert caught.value.body["param"] == "response_id" and missing in caught.value.body["message"]
    r = httpx.post(f"{server.base_url}/v1/responses", json={"input": "Hi", "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    assert server.state.responses.size == 1000  # --responses-store-size's default reached the API server


@pytest.mark.parametrize(("extra", "param"), [
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"truncation": "auto"}, "truncation"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"whatever": 1}, "whatever"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools.0.defer_loading"),
    ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input.0.content.0"),
    ({"input": [{"type": "file_search_call", "id": "fs_1"}]}, "input.0.type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input.0.arguments"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"$ref": "#"}}}}, "text.format"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"tools": [{**WEATHER, "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}],
      "tool_choice": "required"}, "tools.0.parameters"),
    ({"max_output_tokens": 5000}, "max_output_tokens"),
])
def test_unsupported_or_bad_fields_are_400_naming_them(server, extra, param):
    r = httpx.post(f"{server.base_url}/v1/responses", json={"input": "Hi", "max_output_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = save_tiny_qwen3_chat(tmp_path_factory.mktemp("qwen3") / "model", seed=3)
    with running_server(path, device="cpu", dtype="float32", max_seq_len=512, max_batch_size=4) as running:
        yield openai.OpenAI(base_url=f"{running.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_qwen3_reasoning_effort_none_turns_thinking_off(qwen3):
    def chat_prompt(**extra: object) -> int:
        return qwen3.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ASK}], max_tokens=1,
                                             **extra).usage.prompt_tokens

    off = qwen3.responses.create(model=MODEL, input=ASK, max_output_tokens=4, reasoning={"effort": "none"})
    on = qwen3.responses.create(model=MODEL, input=ASK, max_output_tokens=4, reasoning={"effort": "high"})
    assert off.usage.input_tokens == chat_prompt(extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert on.usage.input_tokens == chat_prompt() < off.usage.input_tokens  # the empty think block pre-filled
    assert (off.reasoning.effort, on.reasoning.effort) == ("none", "high")
