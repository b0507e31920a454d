"""The llguidance grammar of a request's answer: its tool calls under their schemas (auto: free text or calls),
or its response_format after Qwen3's reasoning block, compiled before the request is queued.

A tool whose parameters llguidance cannot compile is a 400 naming that tool.
"""

from __future__ import annotations

import json
import weakref

from infer.server.errors import APIError
from infer.server.state import ServerState
from infer.server.tools.formats import ToolFormat, markup
from infer.server.tools.request import ToolRequest
from infer.server.workers import CompileBudget, CompileBusyError, CompileTimeoutError
from infer.structured import Constraint, ConstraintError, GrammarCompiler

MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def think_rules(tokens: frozenset[str]) -> str:
    """An optional reasoning block before the answer: the grammar constrains what follows </think>, never the
    thinking (which ends at the </think> token, or at the first </think> spelled out)."""
    if "</think>" in tokens:
        block = f"think: {markup('<think>', tokens)} THOUGHT? {markup('</think>', tokens)} /\\s*/\nTHOUGHT: /(.|\\n)+/"
    else:
        block = f'think: {markup("<think>", tokens)} thought /\\s*/\nthought[suffix="</think>"]: /(.|\\n)*/'
    return "start: think? answer\n" + block


def markup_tokens(state: ServerState) -> frozenset[str]:
    """The markup the served tokenizer has as single added tokens (llguidance treats those as special); looked up
    once per compiler (the llguidance tokenizer is built at start-up, so this never waits for it)."""
    found = _MARKUP_TOKENS.get(state.grammars)
    if found is None:
        ll = state.grammars.ll_tokenizer
        found = frozenset(m for m in MARKUP if len(ids := ll.tokenize_str(m)) == 1 and ll.is_special_token(ids[0]))
        _MARKUP_TOKENS[state.grammars] = found
    return found


_MARKUP_TOKENS: weakref.WeakKeyDictionary[GrammarCompiler, frozenset[str]] = weakref.WeakKeyDictionary()


def tool_grammar(fmt: ToolFormat, request: ToolRequest, thinking: bool, tokens: frozenset[str] = frozenset()) -> str:
    return (think_rules(tokens) if thinking else "start: answer") + "\n" + fmt.answer_grammar(request, tokens)


def after_reasoning(constraint: Constraint, tokens: frozenset[str] = frozenset()) -> Constraint | None:
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
    return Constraint("grammar", think_rules(tokens) + "\n" + answer)


async def compile_tools(state: ServerState, fmt: ToolFormat, request: ToolRequest, thinking: bool) -> Constraint:
    """The request's tool constraint, compiled against the served tokenizer off the event loop: each tool's
    schema, then the tool-call grammar, all within one --structured-compile-timeout-s of compiling."""
    budget = CompileBudget(state.workers.compile_timeout_s)
    for i, tool in enumerate(request.tools):
        if tool in request.callable():
            schema = Constraint.json_schema({**tool.parameters})
            await compile_constraint(state, schema, f"tools[{i}] ({tool.name}): the parameters schema",
                                     f"tools.{i}.function.parameters", budget)
    constraint = Constraint("grammar", tool_grammar(fmt, request, thinking, markup_tokens(state)))
    await compile_constraint(state, constraint, "tools: the tool-call grammar", "tools", budget)
    return constraint


async def compile_constraint(state: ServerState, constraint: Constraint, what: str, param: str,
                             budget: CompileBudget | None = None) -> None:
    """Compile on the API server's compile pool within --structured-compile-timeout-s (or what is left of a
    request's shared `budget`), as every constraint is."""
    try:
        await state.workers.compile(state.grammars, constraint, budget)
    except ConstraintError as exc:
        raise APIError(400, f"{what} cannot be compiled by llguidance: {exc}", param) from exc
    except CompileTimeoutError as exc:
        raise APIError(400, f"{what} is too costly: {exc}", param) from exc
    except CompileBusyError as exc:
        raise APIError(503, str(exc)) from exc
