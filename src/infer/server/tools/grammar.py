"""The llguidance grammar of a request's answer: its tool calls under their schemas (auto: free text or calls),
or its response_format after Qwen3's reasoning block, compiled before the request is queued.

A tool whose parameters llguidance cannot compile is a 400 naming that tool.
"""

from __future__ import annotations

import asyncio
import json

from infer.server.errors import APIError
from infer.server.state import ServerState
from infer.server.tools.formats import ToolFormat
from infer.server.tools.request import ToolRequest
from infer.structured import Constraint, ConstraintError

# an optional reasoning block before the answer: the grammar constrains what follows </think>, never the thinking
THINK = 'start: think? answer\nthink: "<think>" thought /\\s*/\nthought[suffix="</think>"]: /(.|\\n)*/'


def tool_grammar(fmt: ToolFormat, request: ToolRequest, thinking: bool) -> str:
    return (THINK if thinking else "start: answer") + "\n" + fmt.answer_grammar(request)


def after_reasoning(constraint: Constraint) -> Constraint | None:
    """`constraint` applied to the answer after an optional <think> block, where llguidance's Lark can embed it
    (JSON schemas, JSON objects, regexes, choices); None for a full grammar, which then covers the whole output."""
    if constraint.kind in ("json_schema", "json_object"):
        schema = json.loads(constraint.spec) if constraint.kind == "json_schema" else {"type": "object"}
        options = ({"whitespace_pattern": constraint.whitespace_pattern} if constraint.whitespace_pattern
                   else {"whitespace_flexible": False})
        answer = "answer: %json " + json.dumps({**schema, "x-guidance": options})
    elif constraint.kind == "regex":
        answer = "answer: /" + constraint.spec.replace("/", "\\/") + "/"
    elif constraint.kind == "choice":
        answer = "answer: " + " | ".join(json.dumps(c) for c in json.loads(constraint.spec))
    else:
        return None
    return Constraint("grammar", THINK + "\n" + answer)


async def compile_tools(state: ServerState, fmt: ToolFormat, request: ToolRequest, thinking: bool) -> Constraint:
    """The request's tool constraint, compiled against the served tokenizer off the event loop."""
    for i, tool in enumerate(request.tools):
        if tool in request.callable():
            schema = Constraint.json_schema({**tool.parameters})
            await compile_constraint(state, schema, f"tools[{i}] ({tool.name}): its parameters", f"tools.{i}.function.parameters")
    constraint = Constraint("grammar", tool_grammar(fmt, request, thinking))
    await compile_constraint(state, constraint, "tools: the tool-call grammar", "tools")
    return constraint


async def compile_constraint(state: ServerState, constraint: Constraint, what: str, param: str) -> None:
    try:
        await asyncio.to_thread(state.grammars.compile, constraint)
    except ConstraintError as exc:
        raise APIError(400, f"{what} cannot be compiled by llguidance: {exc}", param) from exc
