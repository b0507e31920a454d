"""Per-request grammar state and the step's token bitmask, filled off the engine thread.

llguidance releases the GIL while it computes masks, so `fill_bitmask` runs on a worker thread while
the engine thread detokenizes and stop-checks the previous step's outputs (docs/structured-output.md).
Invariant: nothing touches a matcher while a fill that reads it is in flight; the engine reads each
matcher's state (error, complete) in `advance`, before the fill starts, and only from `Grammar` after.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import llguidance.torch
import torch


@dataclass(eq=False)
class Grammar:
    """One request's matcher and what `advance` last read from it."""

    matcher: llguidance.LLMatcher
    error: str | None = None  # the sampled token was refused (the tokenizer cannot spell the constraint)
    complete: bool = False  # the grammar has ended: the request stops

    @property
    def open(self) -> bool:
        """Whether the next token still needs a mask."""
        return self.error is None and not self.complete


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool: the rows of a step are advanced and filled in parallel."""
    return llguidance.LLExecutor()


@functools.cache
def _worker() -> ThreadPoolExecutor:
    """The thread a step's fill runs on while the engine thread processes outputs."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer-masks")


def advance(pairs: list[tuple[Grammar, int]]) -> None:
    """Feed each grammar its request's sampled token (in parallel for several) and read the new state."""
    if not pairs:
        return
    if len(pairs) == 1:
        accepted = [pairs[0][0].matcher.consume_token(pairs[0][1])]
    else:
        accepted = _executor().consume_token_par([(g.matcher, token) for g, token in pairs])
    for (grammar, _), ok in zip(pairs, accepted):
        if not ok:
            grammar.error = grammar.matcher.get_error()
        grammar.complete = grammar.matcher.is_stopped()


def has_open(grammars: list[Grammar | None]) -> bool:
    """Whether any row needs a mask; a step without one pays nothing for structured output."""
    return any(g is not None and g.open for g in grammars)


def fill_bitmask(grammars: list[Grammar | None], vocab_size: int) -> Future[torch.Tensor]:
    """[rows, ceil(vocab/32)] int32 on the host, filled on the worker thread: each open grammar's allowed
    tokens, all ones for the other rows (unconstrained, or ending this step: their token is dropped).
    Pinned where CUDA is, so the upload needs no copy and does not block."""
    rows = [(g.matcher, row) for row, g in enumerate(grammars) if g is not None and g.open]
    return _worker().submit(_fill, rows, len(grammars), vocab_size)


def _fill(rows: list[tuple[llguidance.LLMatcher, int]], num_rows: int, vocab_size: int) -> torch.Tensor:
    mask = torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
    if len(rows) == 1:
        llguidance.torch.fill_next_token_bitmask(rows[0][0], mask, rows[0][1])
    elif rows:
        llguidance.torch.fill_next_token_bitmask_par(_executor(), rows, mask)
    return mask
