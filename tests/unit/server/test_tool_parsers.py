"""Tool-call and reasoning parsers on hand-written model outputs of every family: well-formed, malformed and cut
off; streamed in any chunking they give the same calls as the whole text, and no markup reaches the content."""

from __future__ import annotations

import json
import random

import pytest

from infer.server.chat_output import ChatShape
from infer.server.reasoning import split_reasoning
from infer.server.tools.formats import HermesFormat, LlamaJsonFormat, ToolFormat, tool_format
from infer.server.tools.request import FunctionTool, ToolRequest

TOOLS = ToolRequest((FunctionTool("get_weather", {"type": "object"}), FunctionTool("get_time", {"type": "object"})),
                    "auto")
NAMES = {"get_weather", "get_time"}
W = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
T = '{"name": "get_time", "arguments": {}}'
WEATHER = ("get_weather", '{"city": "Paris", "unit": "C"}')
TIME = ("get_time", "{}")

HERMES = [  # (model text, content, calls)
    ("The sky is blue.", "The sky is blue.", []),
    (f"<tool_call>\n{W}\n</tool_call>", None, [WEATHER]),
    (f"Let me check.\n<tool_call>\n{W}\n</tool_call>", "Let me check.", [WEATHER]),
    (f"<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{T}\n</tool_call>", None, [WEATHER, TIME]),
    (f"<tool_call>{W}</tool_call>", None, [WEATHER]),  # no newlines inside the tags
    ('<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}\n</tool_call>', None, [WEATHER]),
    ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>",  # malformed JSON
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>", []),
    ('<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>',  # not an offered function
     '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>', []),
    ('<tool_call>\n{"name": "get_time", "arguments": "now"}\n</tool_call>',  # arguments not an object
     '<tool_call>\n{"name": "get_time", "arguments": "now"}\n</tool_call>', []),
    (f"<tool_call>\n{W[:30]}", f"<tool_call>\n{W[:30]}", []),  # cut off by max_tokens
    (f"<tool_call>\n{T}\n</tool_call>\n<tool_call>\nbroken\n</tool_call>", "<tool_call>\nbroken\n</tool_call>", [TIME]),
    ("a < b and <tool_ c", "a < b and <tool_ c", []),
]
LLAMA = [
    ("The sky is blue.", "The sky is blue.", []),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}', None, [WEATHER]),
    ('<|python_tag|>{"name": "get_time", "parameters": {}}', None, [TIME]),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}; {"name": "get_time", "parameters": {}}',
     None, [WEATHER, TIME]),
    ('  {"name": "get_time", "arguments": {}}\n', None, [TIME]),
    ('{"name": "get_weather", "parameters": {"city": "Par', '{"name": "get_weather", "parameters": {"city": "Par', []),
    ('{"name": "nope", "parameters": {}}', '{"name": "nope", "parameters": {}}', []),
    ('{"name": "get_time", "parameters": {}} and then text', '{"name": "get_time", "parameters": {}} and then text', []),
    ('{"a": 1}', '{"a": 1}', []),
]
CASES = [(HermesFormat(), c) for c in HERMES] + [(LlamaJsonFormat(), c) for c in LLAMA]


@pytest.mark.parametrize(("fmt", "case"), CASES, ids=[f"{f.name}-{i}" for i, (f, _) in enumerate(CASES)])
def test_whole_text(fmt: ToolFormat, case: tuple) -> None:
    text, content, calls = case
    got_content, got_calls = fmt.parse(text, NAMES)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for call in got_calls:
        json.loads(call.arguments)


MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def _stream(shape: ChatShape, text: str, seed: int) -> tuple[str, str, list[tuple[str, str]], int]:
    """(content, reasoning, calls) as an openai client reassembles them from the deltas of a random chunking
    (odd seeds also cut around every marker, as a tokenizer with the markers as tokens does)."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randrange(0, 12)))) if len(text) > 1 else []
    if seed % 2:
        marks = {i + d for m in MARKERS for i in range(len(text)) if text.startswith(m, i) for d in (0, len(m))}
        cuts = sorted({*cuts, *marks} - {0, len(text)})
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    stream = shape.stream()
    deltas = [d for p in pieces for d in stream.feed(p)] + stream.close()
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for call in d.get("tool_calls", []):
            if "id" in call:
                assert call["function"]["arguments"] == "" and call["id"].startswith("call_")
                calls[call["index"]] = [call["function"]["name"], ""]
            calls[call["index"]][1] += call["function"]["arguments"]
    return content, reasoning, [tuple(calls[i]) for i in sorted(calls)], len(deltas)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("fmt", "case"), CASES, ids=[f"{f.name}-{i}" for i, (f, _) in enumerate(CASES)])
def test_streamed_calls_equal_whole(fmt: ToolFormat, case: tuple, seed: int) -> None:
    text, content, calls = case
    got_content, _, got_calls, _ = _stream(ChatShape(fmt, TOOLS), text, seed)
    assert got_calls == calls
    assert "<tool_call>" not in got_content or content is not None and "<tool_call>" in content
    if not calls:
        assert got_content.strip() == text.strip()
    else:
        assert got_content.split() == (content or "").split()


QWEN = ChatShape(tool_format("qwen3"), TOOLS, reasoning=True)
REASONING = [  # (text, reasoning, content, calls)
    ("<think>\nLet me think.\n</think>\n\nParis.", "Let me think.", "Paris.", []),
    ("<think>\n\n</think>\n\nParis.", "", "Paris.", []),
    ("Paris.", None, "Paris.", []),
    ("<think>\nStill thinking", "Still thinking", "", []),
    (f"<think>\nI need the weather.\n</think>\n\n<tool_call>\n{W}\n</tool_call>", "I need the weather.", None, [WEATHER]),
    ("<think>a</think>b</think>c", "a", "b</think>c", []),
]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("case", REASONING)
def test_qwen3_reasoning_whole_and_streamed(case: tuple, seed: int) -> None:
    text, reasoning, content, calls = case
    message, finish = QWEN.message(text, "stop")
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])] == calls
    assert finish == ("tool_calls" if calls else "stop")
    got_content, got_reasoning, got_calls, _ = _stream(QWEN, text, seed)
    assert (got_reasoning, got_content, got_calls) == (reasoning or "", content or "", calls)


def test_split_reasoning_leaves_text_without_a_block_alone() -> None:
    assert split_reasoning("  no block <think>x</think>") == (None, "  no block <think>x</think>")


def test_finish_reason_is_tool_calls_only_when_a_call_ended_the_answer() -> None:
    shape = ChatShape(HermesFormat(), TOOLS)
    assert shape.message(f"<tool_call>\n{T}\n</tool_call>", "stop")[1] == "tool_calls"
    assert shape.message(f"<tool_call>\n{T}", "length")[1] == "length"
    stream = shape.stream()
    stream.feed(f"<tool_call>\n{T}\n</tool_call>")
    assert stream.finish_reason("stop") == "tool_calls"
