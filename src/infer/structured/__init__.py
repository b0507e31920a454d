"""Structured output: constraints (JSON schema, JSON object, regex, choice, Lark grammar) compiled by
llguidance, one matcher per request, token masks applied to the logits before sampling."""

from infer.structured.compiler import ConstraintError, GrammarCompiler, UnsatisfiableConstraintError
from infer.structured.constraint import KINDS, Constraint

__all__ = ["KINDS", "Constraint", "ConstraintError", "GrammarCompiler", "UnsatisfiableConstraintError"]
