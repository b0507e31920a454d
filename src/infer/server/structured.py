"""The one output constraint a request asks for, from whichever field it used, compiled before it is queued.

OpenAI's `response_format` (`json_object`, `json_schema`; `text` is no constraint), vLLM's
`structured_outputs` and the older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` map onto `infer.structured.Constraint`. Two sources at once, a constraint llguidance
cannot compile (or not within --structured-compile-timeout-s), or one no output can satisfy, is a 400 naming
the field, with llguidance's own message.
"""

from __future__ import annotations

from typing import Any

from infer.server.errors import APIError
from infer.server.protocol import RESPONSE_FORMATS, SamplingFields, StructuredOutputs
from infer.server.state import ServerState
from infer.server.workers import CompileBusyError, CompileTimeoutError
from infer.structured import Constraint, ConstraintError, UnsatisfiableConstraintError


def _json(schema: dict[str, Any] | str, whitespace: str | None) -> Constraint:
    return Constraint.json_schema(schema, whitespace)


def _from_structured_outputs(so: StructuredOutputs) -> Constraint:
    given = {name: value for name, value in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                             ("grammar", so.grammar), ("json_object", so.json_object or None))
             if value is not None}
    if len(given) != 1:
        raise APIError(400, f"structured_outputs needs exactly one of json, regex, choice, grammar, json_object; "
                            f"got {', '.join(given) or 'none'}", "structured_outputs")
    kind, value = next(iter(given.items()))
    if kind == "json":
        return _json(value, so.whitespace_pattern)
    if kind == "json_object":
        return Constraint("json_object", whitespace_pattern=so.whitespace_pattern)
    if kind == "choice":
        return _choice(value, "structured_outputs")
    return Constraint(kind, value)


def _choice(choices: list[str], param: str) -> Constraint:
    try:
        return Constraint.choice(choices)
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param) from exc


def _sources(body: SamplingFields) -> list[tuple[str, Constraint]]:
    out: list[tuple[str, Constraint]] = []
    rf = body.response_format
    if rf is not None and rf.type not in RESPONSE_FORMATS:
        raise APIError(400, f"response_format: unknown type {rf.type!r}; use one of {', '.join(RESPONSE_FORMATS)}",
                       "response_format")
    if rf is not None and rf.type == "json_object":
        out.append(("response_format", Constraint("json_object")))
    if rf is not None and rf.type == "json_schema":
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise APIError(400, "response_format: type json_schema needs json_schema.schema", "response_format")
        out.append(("response_format", _json(rf.json_schema.schema_, None)))
    if body.structured_outputs is not None:
        out.append(("structured_outputs", _from_structured_outputs(body.structured_outputs)))
    if body.guided_json is not None:
        out.append(("guided_json", _json(body.guided_json, body.guided_whitespace_pattern)))
    if body.guided_regex is not None:
        out.append(("guided_regex", Constraint("regex", body.guided_regex)))
    if body.guided_choice is not None:
        out.append(("guided_choice", _choice(body.guided_choice, "guided_choice")))
    if body.guided_grammar is not None:
        out.append(("guided_grammar", Constraint("grammar", body.guided_grammar)))
    return out


async def requested_constraint(state: ServerState, body: SamplingFields) -> Constraint | None:
    """The request's constraint, compiled (and cached) against the served tokenizer on a worker thread within the
    compile budget; None for free text."""
    sources = _sources(body)
    if len(sources) > 1:
        raise APIError(400, f"give one output constraint, not {' and '.join(p for p, _ in sources)}", sources[1][0])
    if not sources:
        return None
    param, constraint = sources[0]
    try:
        await state.workers.compile(state.grammars, constraint)
    except UnsatisfiableConstraintError as exc:
        raise APIError(400, f"{param}: {exc}", param) from exc
    except ConstraintError as exc:
        what = "is beyond llguidance's limits" if exc.is_limit else "cannot be compiled"
        raise APIError(400, f"{param}: this {constraint.kind} constraint {what}: {exc}", param) from exc
    except CompileTimeoutError as exc:
        raise APIError(400, f"{param}: this {constraint.kind} constraint is too costly: {exc}", param) from exc
    except CompileBusyError as exc:
        raise APIError(503, str(exc)) from exc
    return constraint
