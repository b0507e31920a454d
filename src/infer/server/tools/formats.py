"""Each family's tool-call text: how a call is written, parsed back out of the model's text, and constrained.

Hermes (Qwen3, and our convention for SmolLM2 and Gemma 3): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
several separated by a newline, free text around them. Llama 3.x: the answer is the calls themselves,
`{"name": ..., "parameters": {...}}`, several joined by "; " (after an optional <|python_tag|>).
A call that does not parse, or names a function that is not offered, stays text: never an error.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from infer.server.tools.request import FunctionTool, ToolRequest

# whitespace as the templates write JSON (json.dumps' separators), none elsewhere: a small model cannot loop on spaces
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as json.dumps writes it


def call_from(obj: object, names: set[str], keys: tuple[str, ...]) -> ParsedCall | None:
    """The call a decoded JSON object describes, or None when it is not one of the offered functions."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = next((obj[k] for k in keys if k in obj), None)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _lark(text: str) -> str:
    return json.dumps(text)


def markup(text: str, tokens: frozenset[str]) -> str:
    """A Lark reference to markup text: the tokenizer's own token where it has one (llguidance matches an added
    token only by name, and free text never contains one), else the literal string."""
    return text if text in tokens else _lark(text)


def _head(name: str, key: str, before: str = "") -> str:
    """A call's JSON up to its arguments: `{"name": "<name>", "<key>": `."""
    return before + "{" + json.dumps("name") + ": " + json.dumps(name) + ", " + json.dumps(key) + ": "


def _arguments(tool: FunctionTool) -> str:
    schema: dict[str, Any] = {**tool.parameters, "x-guidance": COMPACT}
    return "%json " + json.dumps(schema)


class ToolFormat(ABC):
    """How one family writes tool calls; `reasoning`: its answers may open with a <think> block (Qwen3)."""

    name: str
    reasoning: bool = False

    @abstractmethod
    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        """(content outside the calls, the calls); text with no well-formed call comes back unchanged."""

    @abstractmethod
    def answer_grammar(self, request: ToolRequest, tokens: frozenset[str] = frozenset()) -> str:
        """Lark rules whose `answer` is what the request allows: free text or calls (auto), or calls only;
        `tokens`: the markup the tokenizer has as single added tokens."""


class HermesFormat(ToolFormat):
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, reasoning: bool = False) -> None:
        self.reasoning = reasoning

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        content: list[str] = []
        calls: list[ParsedCall] = []
        pos = 0
        while (start := text.find(self.OPEN, pos)) >= 0 and (end := text.find(self.CLOSE, start)) >= 0:
            call = self.body(text[start + len(self.OPEN) : end], names)
            content.append(text[pos:start] if call is not None else text[pos : end + len(self.CLOSE)])
            calls += [call] if call is not None else []
            pos = end + len(self.CLOSE)
        if not calls:
            return text, []
        rest = "".join(content) + text[pos:]
        return rest.strip() or None, calls

    @staticmethod
    def body(text: str, names: set[str]) -> ParsedCall | None:
        """The call between the tags, or None when it is malformed."""
        try:
            return call_from(json.loads(text), names, ("arguments", "parameters"))
        except json.JSONDecodeError:
            return None

    def answer_grammar(self, request: ToolRequest, tokens: frozenset[str] = frozenset()) -> str:
        tools = request.callable()
        rules = [f"body_{i}: {_lark(_head(t.name, 'arguments', chr(10)))} args_{i} {_lark('}' + chr(10))}\n"
                 f"args_{i}: {_arguments(t)}" for i, t in enumerate(tools)]
        rules.append("body: " + " | ".join(f"body_{i}" for i in range(len(tools))))
        rules.append(f"call: {markup(self.OPEN, tokens)} body {markup(self.CLOSE, tokens)}")
        more = '("\\n" call)*' if request.parallel else ""
        if request.choice != "auto":
            rules.append(f"answer: call {more}")
        elif self.OPEN in tokens:  # free text ends where the model emits the call's token
            rules += [f"answer: FREE | FREE? call {more}", f"FREE: /(.|\\n)+/ & ~/(.|\\n)*{self.OPEN}(.|\\n)*/"]
        else:  # free text that never spells the tag, or text up to the tag and the rest of a call
            rules += [f"answer: FREE | pre body {markup(self.CLOSE, tokens)} {more}",
                      f"pre[suffix={_lark(self.OPEN)}]: /(.|\\n)*/",
                      f"FREE: /(.|\\n)*/ & ~/(.|\\n)*{self.OPEN}(.|\\n)*/"]
        return "\n".join(rules)


class LlamaJsonFormat(ToolFormat):
    name = "llama3_json"

    def parse(self, text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        calls: list[ParsedCall] = []
        decoder, pos = json.JSONDecoder(), 0
        while body.startswith("{", pos):
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return text, []
            call = call_from(obj, names, ("parameters", "arguments"))
            if call is None:
                return text, []
            calls.append(call)
            rest = body[pos:].lstrip()
            pos = len(body) - len(rest)
            if rest.startswith(";"):
                pos = len(body) - len(rest[1:].lstrip())
        if not calls or pos < len(body):
            return text, []
        return None, calls

    def answer_grammar(self, request: ToolRequest, tokens: frozenset[str] = frozenset()) -> str:
        tools = request.callable()
        rules = [f"call_{i}: {_lark(_head(t.name, 'parameters'))} args_{i} \"}}\"\nargs_{i}: {_arguments(t)}"
                 for i, t in enumerate(tools)]
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
        calls = 'call ("; " call)*' if request.parallel else "call"
        if request.choice == "auto":
            rules.append(f"answer: (FREE | {calls})?")
            rules.append("FREE: /(.|\\n)+/ & ~/\\s*\\{(.|\\n)*/")  # text that is not a call, even after spaces
        else:
            rules.append(f"answer: {calls}")
        return "\n".join(rules)


def tool_format(template_name: str) -> ToolFormat:
    """The call format of a bundled chat template (Qwen3's also splits off <think> reasoning)."""
    if template_name == "llama3":
        return LlamaJsonFormat()
    return HermesFormat(reasoning=template_name == "qwen3")
