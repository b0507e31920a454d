"""What a request's output must match, as one typed value the API, the CLI and `SamplingParams` share."""

from __future__ import annotations

import json
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
JSON_OBJECT_SCHEMA = '{"type": "object"}'


@dataclass(frozen=True)
class Constraint:
    """`spec` is the JSON schema as JSON text, the regex, the Lark (or GBNF) grammar, or a JSON list of choices.

    JSON is compact by default (no whitespace between tokens): unbounded whitespace lets a small
    model loop on spaces. `whitespace_pattern` (a regex) opts into the whitespace it allows.
    """

    kind: str
    spec: str = ""
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict | str, whitespace_pattern: str | None = None) -> Constraint:
        text = schema if isinstance(schema, str) else json.dumps(schema)  # key order is property order
        return cls("json_schema", text, whitespace_pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> Constraint:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError("choice needs a non-empty list of strings")
        return cls("choice", json.dumps(list(choices)))

    def grammar(self) -> str:
        """The llguidance grammar (not yet checked against a tokenizer: `GrammarCompiler` does that)."""
        if self.kind in ("json_schema", "json_object"):
            options = {"whitespace_pattern": self.whitespace_pattern} if self.whitespace_pattern else \
                {"whitespace_flexible": False}
            schema = JSON_OBJECT_SCHEMA if self.kind == "json_object" else self.spec
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            # one lexeme, not one rule per choice: the lexer's DFA takes 20,000 choices where the parser's rows
            # stop at llguidance's 2,000 items
            alternatives = " | ".join(json.dumps(c) for c in json.loads(self.spec))
            return llguidance.LLMatcher.grammar_from_lark(f"start: CHOICE\nCHOICE: {alternatives}")
        return llguidance.LLMatcher.grammar_from_lark(any_to_lark(self.spec))  # GBNF is converted, Lark kept
