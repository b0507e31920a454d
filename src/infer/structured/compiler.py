"""Compile constraints against one model's tokenizer: the llguidance tokenizer is built once per model,
compiled grammars are cached as unused matchers, and each request gets its own copy."""

from __future__ import annotations

import threading
from collections import OrderedDict

import llguidance

from infer.loader.tokenizer import Tokenizer
from infer.structured.constraint import Constraint

CACHE_SIZE = 1024


class ConstraintError(ValueError):
    """A constraint llguidance cannot compile; the message is llguidance's own (which keyword, which rule)."""

    @property
    def is_limit(self) -> bool:
        """Whether llguidance refused it for its size (a limit of the library, not an error in the constraint)."""
        return is_limit_message(str(self))


def first_part(error: str) -> str:
    """llguidance's message without the parser state and whole grammar it appends (kilobytes for a big schema)."""
    return error.split("\n<state>", 1)[0].strip()


def is_limit_message(text: str) -> bool:
    """Whether an llguidance error is one of its size limits ("Current row has 40007 items; max is 2000",
    "grammar too big", "... limit ...") rather than a mistake in the constraint."""
    text = text.lower()
    return "too big" in text or "limit" in text or "max is" in text or "too complex" in text


class UnsatisfiableConstraintError(ConstraintError):
    """A constraint no output can satisfy: llguidance allows no token at its start (e.g. regex `[^\\s\\S]`)."""


class GrammarCompiler:
    """Thread-safe: the server compiles on its event loop, the engine makes matchers on its thread."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._ll: llguidance.LLTokenizer | None = None
        self.unavailable: str | None = None  # why llguidance cannot read this tokenizer, once `prepare` found out
        self._matchers: OrderedDict[Constraint, llguidance.LLMatcher] = OrderedDict()  # unused templates, copied
        self._lock = threading.Lock()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """Built by `prepare` at a server's start-up, else on first use; then shared by every grammar and matcher.
        ConstraintError when llguidance cannot read the tokenizer: every constraint fails with that reason."""
        if self.prepare() is not None:
            raise ConstraintError(f"structured output and tools are not available for this model: {self.unavailable}")
        assert self._ll is not None
        return self._ll

    def prepare(self) -> str | None:
        """Build the llguidance tokenizer now, at start-up, rather than in the first constrained request: 0.26 s
        for SmolLM2's 49k-token vocabulary, 2.9 s for Gemma 3's 262k on the 2-core development machine, holding
        the GIL for up to ~0.2 s at a time, so built on a thread while serving it would pause every stream.
        Returns why llguidance cannot read the tokenizer (a model without structured output), else None."""
        with self._lock:
            if self._ll is None and self.unavailable is None:
                try:
                    self._ll = llguidance.LLTokenizer(self._tokenizer.backend.to_str(), n_vocab=self._vocab_size,
                                                      eos_token=sorted(self._tokenizer.eos_token_ids))
                except Exception as exc:  # noqa: BLE001 - llguidance's reasons vary (ValueError, RuntimeError, ...)
                    self.unavailable = f"llguidance cannot read its tokenizer ({type(exc).__name__}: {exc})"
            return self.unavailable

    def is_cached(self, constraint: Constraint) -> bool:
        """Whether `constraint` is compiled already (a matcher for it takes microseconds)."""
        with self._lock:
            return constraint in self._matchers

    def compile(self, constraint: Constraint) -> None:
        """Check `constraint` against the tokenizer and cache it; ConstraintError names what llguidance could not do."""
        self._template(constraint)

    def matcher(self, constraint: Constraint) -> llguidance.LLMatcher:
        """A fresh matcher at the start of `constraint`'s grammar: a copy of the cached one (microseconds, where
        building a matcher from its grammar takes milliseconds)."""
        template = self._template(constraint)
        with self._lock:
            return template.deep_copy()

    def _template(self, constraint: Constraint) -> llguidance.LLMatcher:
        with self._lock:
            if constraint in self._matchers:
                self._matchers.move_to_end(constraint)
                return self._matchers[constraint]
        try:
            grammar = constraint.grammar()
        except Exception as exc:  # llguidance raises ValueError/RuntimeError with its message
            raise ConstraintError(str(exc)) from exc
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise ConstraintError("; ".join(messages) if isinstance(messages, list) else str(messages))
        template = llguidance.LLMatcher(self.ll_tokenizer, grammar)
        if template.is_error():
            raise ConstraintError(first_part(template.get_error()))
        _check_satisfiable(template)
        with self._lock:
            self._matchers[constraint] = template
            while len(self._matchers) > CACHE_SIZE:
                self._matchers.popitem(last=False)
        return template


def _check_satisfiable(template: llguidance.LLMatcher) -> None:
    """UnsatisfiableConstraintError when the grammar allows nothing at all, not even an empty output: llguidance
    stops the matcher at its first mask. The template keeps that mask (computing it does not advance it), so every
    matcher copied from it starts with it: a large grammar's first mask (~0.3 s for 10,000 properties) is paid here,
    on the compile thread, not inside an engine step where every other request would wait for it."""
    template.compute_bitmask()
    if template.is_error() and not template.is_accepting():
        raise UnsatisfiableConstraintError("no output can satisfy it: llguidance allows no token at its start (no "
                                           "text matches it, not even an empty one, that this tokenizer can spell)")
