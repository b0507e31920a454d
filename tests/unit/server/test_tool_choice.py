"""How many calls a tool choice allows: a named function is called once whatever parallel_tool_calls says;
required and auto follow parallel_tool_calls (OpenAI's default: true); the grammars end after one call where
only one is allowed."""

from __future__ import annotations

import re

import pytest

from infer.server.protocol import ChatCompletionRequest
from infer.server.tools import tool_request
from infer.server.tools.formats import HermesFormat, LlamaJsonFormat

TOOLS = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(2)]
NAMED = {"type": "function", "function": {"name": "f1"}}


def _request(choice: object, parallel: bool | None):
    return tool_request(ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, "tool_choice": choice,
        "parallel_tool_calls": parallel}))


@pytest.mark.parametrize(("choice", "parallel", "several"), [
    (NAMED, None, False), (NAMED, True, False), (NAMED, False, False),
    ("required", None, True), ("required", True, True), ("required", False, False),
    ("auto", None, True), ("auto", True, True), ("auto", False, False),
])
def test_several_calls_only_where_the_choice_and_parallel_tool_calls_allow(choice, parallel, several):
    assert _request(choice, parallel).parallel is several


@pytest.mark.parametrize("fmt", [HermesFormat(), LlamaJsonFormat()])
def test_a_named_choice_grammar_ends_after_one_call(fmt):
    named = fmt.answer_grammar(_request(NAMED, True))
    assert re.search(r"^answer: call\s*$", named, re.M) and "call)*" not in named
    assert "call)*" in fmt.answer_grammar(_request("required", True))
