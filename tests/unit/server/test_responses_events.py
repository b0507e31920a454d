"""The Responses API's pieces without a server: a Qwen 3 answer (reasoning, text, a call) streamed in any chunking
gives typed events the openai SDK parses, in order, and the same output items as the whole answer; the response
store's LRU bound; chat-machinery errors renamed to the Responses fields; the CLI flag reaching ServerLimits."""

from __future__ import annotations

import json
import random

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from infer.cli import build_parser
from infer.cli.flags import HTTP_FLAGS
from infer.server.chat_output import ChatShape
from infer.server.errors import APIError
from infer.server.limits import ServerLimits
from infer.server.responses_items import output_items, renamed
from infer.server.responses_protocol import MessageItem
from infer.server.responses_store import ResponseStore, StoredResponse
from infer.server.responses_stream import OutputEvents
from infer.server.tools.formats import HermesFormat
from infer.server.tools.request import FunctionTool, ToolRequest

EVENT = TypeAdapter(ResponseStreamEvent)
SHAPE = ChatShape(HermesFormat(reasoning=True), ToolRequest((FunctionTool("get_weather", {"type": "object"}),), "auto"),
                  reasoning=True)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANSWER = f"<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n{CALL}"


def _events(text: str, seed: int, complete: bool = True) -> tuple[list[dict], list[dict]]:
    """Events (parsed back from SSE) and output items of `text` fed in random pieces."""
    rng, events, stream, sent = random.Random(seed), OutputEvents(), SHAPE.stream(), []
    pos = 0
    while pos < len(text):
        step = rng.randint(1, 7)
        sent += events.feed(stream.feed(text[pos : pos + step]))
        pos += step
    sent += events.feed(stream.close()) + events.close(complete)
    payloads = []
    for event in sent:
        kind, data = event.removesuffix("\n\n").split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}"
        EVENT.validate_python(payload)  # the SDK's own type for it
        payloads.append(payload)
    return payloads, events.items


def _without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("seed", range(5))
def test_reasoning_text_and_call_stream_as_typed_events(seed):
    events, items = _events(ANSWER, seed)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events if not e["type"].endswith(".delta")]
    item = ["response.output_item.added", "response.content_part.added"]
    assert kinds == [*item, "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
                     *item, "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.done",
                     "response.output_item.done"]
    reasoning = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert (reasoning, text) == ("The user wants the weather.", "Let me check.")
    whole, _ = SHAPE.message(ANSWER, "stop")
    assert _without_ids(items) == _without_ids(output_items(whole, True))
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert json.loads(items[2]["arguments"]) == {"city": "Paris"} and items[2]["call_id"].startswith("call_")


def test_an_answer_with_nothing_is_one_empty_message():
    events, items = _events("", 0)
    assert [e["type"] for e in events] == ["response.output_item.added", "response.content_part.added",
                                           "response.output_text.done", "response.content_part.done",
                                           "response.output_item.done"]
    whole, _ = SHAPE.message("", "stop")
    assert _without_ids(items) == _without_ids(output_items(whole, True))


@pytest.mark.parametrize("seed", range(3))
def test_a_cut_off_answer_leaves_its_last_item_incomplete_streamed_or_whole(seed):
    text = "<think>\nShort.\n</think>\n\nThe weather in"
    _, items = _events(text, seed, complete=False)
    whole, _ = SHAPE.message(text, "length")
    assert _without_ids(items) == _without_ids(output_items(whole, False))
    assert [(i["type"], i["status"]) for i in items] == [("reasoning", "completed"), ("message", "incomplete")]


def test_cut_off_reasoning_is_a_reasoning_item_only():
    whole, _ = SHAPE.message("<think>\nStill thinking", "length")
    [item] = output_items(whole, False)
    assert item["type"] == "reasoning" and item["content"][0]["text"] == "Still thinking"
    assert item["status"] == "incomplete"


def test_the_store_keeps_the_most_recently_used():
    store = ResponseStore(2)
    entry = StoredResponse({"id": "x"}, (MessageItem(role="user", content="hi"),))
    for key in ("a", "b"):
        store.put(key, entry)
    assert store.get("a") is entry  # a is now the most recently used
    store.put("c", entry)
    assert (store.get("b"), len(store)) == (None, 2) and store.get("a") is entry and store.get("c") is entry
    empty = ResponseStore(0)
    empty.put("a", entry)
    assert empty.get("a") is None


@pytest.mark.parametrize(("param", "message", "expected"), [
    ("response_format", "response_format: cannot be compiled", ("text.format", "text.format: cannot be compiled")),
    ("tools.3.function.parameters", "tools[3]: bad", ("tools.3.parameters", "tools[3]: bad")),
    ("max_tokens", "reduce max_tokens", ("max_output_tokens", "reduce max_output_tokens")),
    ("messages.2.content", "messages.2.content is bad", ("input", "messages.2.content is bad")),
    ("tool_choice", "unknown", ("tool_choice", "unknown")),
])
def test_chat_errors_are_renamed_to_responses_fields(param, message, expected):
    error = renamed(APIError(400, message, param, "code"))
    assert (error.param, error.message) == expected and (error.status, error.code) == (400, "code")


def test_the_store_size_flag_reaches_the_server_limits():
    args = build_parser().parse_args(["serve", "--responses-store-size", "7"])
    assert ServerLimits(**{name: getattr(args, name) for name in HTTP_FLAGS}).responses_store_size == 7
    assert build_parser().parse_args(["serve"]).responses_store_size == ServerLimits().responses_store_size == 1000
    with pytest.raises(ValueError, match="--responses-store-size"):
        ServerLimits(responses_store_size=-1)
