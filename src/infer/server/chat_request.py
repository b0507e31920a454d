"""What a chat request adds to a plain generation: the template's arguments (tools, enable_thinking), the shape of
its answer (reasoning, tool calls) and the constraint its answer is generated under."""

from __future__ import annotations

from typing import Any

from infer.server.chat_output import ChatShape
from infer.server.errors import APIError
from infer.server.protocol import ChatCompletionRequest
from infer.server.state import ServerState
from infer.server.tools.formats import tool_format
from infer.server.tools.grammar import after_reasoning, compile_constraint, compile_tools, markup_tokens
from infer.server.tools.request import ToolRequest
from infer.structured import Constraint

TEMPLATE_KWARGS = {"enable_thinking": bool}  # chat_template_kwargs the templates read
THINKING_OFF = ("none", "minimal")  # reasoning_effort values that turn thinking off (enable_thinking=false)


def template_arguments(body: ChatCompletionRequest, tools: ToolRequest | None) -> dict[str, Any]:
    """The chat template's extra arguments; an unknown or mistyped chat_template_kwargs entry is a 400 naming it.
    reasoning_effort "none" or "minimal" turns thinking off where chat_template_kwargs does not say."""
    out: dict[str, Any] = {}
    for key, value in (body.chat_template_kwargs or {}).items():
        kind = TEMPLATE_KWARGS.get(key)
        if kind is None or not isinstance(value, kind):
            expected = ", ".join(f"{k} ({t.__name__})" for k, t in TEMPLATE_KWARGS.items())
            raise APIError(400, f"chat_template_kwargs.{key}: not supported or mistyped; supported: {expected}",
                           f"chat_template_kwargs.{key}", "unsupported_parameter")
        out[key] = value
    if body.reasoning_effort in THINKING_OFF:
        out.setdefault("enable_thinking", False)
    if tools is not None:
        out["tools"] = tools.definitions()
    return out


def chat_shape(state: ServerState, tools: ToolRequest | None) -> ChatShape:
    fmt = tool_format(state.built.chat_template_name)
    return ChatShape(fmt, tools, fmt.reasoning)


def thinking(body: ChatCompletionRequest, shape: ChatShape) -> bool:
    """Whether the answer may open with a reasoning block (Qwen3 unless thinking is off)."""
    return shape.reasoning and template_arguments(body, None).get("enable_thinking") is not False


async def answer_constraint(state: ServerState, body: ChatCompletionRequest, shape: ChatShape,
                            requested: Constraint | None) -> Constraint | None:
    """The tools' grammar, or the requested output constraint (after the reasoning block where it can be)."""
    think = thinking(body, shape)
    if shape.tools is not None:
        if requested is not None:
            raise APIError(400, "an output constraint (response_format, structured_outputs or guided_*) cannot be "
                                "combined with tools; use tool_choice \"none\" or drop the tools", "tool_choice")
        return await compile_tools(state, shape.fmt, shape.tools, think)
    if requested is None or not think:
        return requested
    wrapped = after_reasoning(requested, markup_tokens(state))
    if wrapped is None:
        return requested
    await compile_constraint(state, wrapped, "the output constraint after the reasoning block", "response_format")
    return wrapped
