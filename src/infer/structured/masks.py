"""Per-request grammar state and the step's token bitmask, filled off the engine thread.

llguidance releases the GIL while it computes masks, so `BitmaskFiller` runs the fill on a worker thread
while the engine thread detokenizes and stop-checks the previous step's outputs (docs/structured-output.md).
Invariant: nothing touches a matcher while a fill that reads it is in flight; the engine reads each
matcher's state (error, complete) in `advance`, before the fill starts, and only from `Grammar` after.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import llguidance
import torch

from infer.structured.compiler import first_part, is_limit_message


@dataclass(eq=False)
class Grammar:
    """One request's matcher and what `advance` last read from it."""

    matcher: llguidance.LLMatcher
    error: str | None = None  # why the constraint stopped the request (`refusal`): a token refused, or a limit
    complete: bool = False  # the grammar has ended: the request stops

    @property
    def open(self) -> bool:
        """Whether the next token still needs a mask."""
        return self.error is None and not self.complete


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool: the rows of a step are advanced and filled in parallel."""
    return llguidance.LLExecutor()


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
            grammar.error = refusal(grammar.matcher.get_error())
        grammar.complete = grammar.matcher.is_stopped()


def refusal(error: str) -> str:
    """Why a request's constraint stopped it, in one sentence: llguidance's first line (the rest of its message
    dumps the parser state and the whole grammar), named as llguidance's limit when it is one."""
    text = first_part(error)
    if is_limit_message(text):
        return f"the output constraint is beyond llguidance's limits: {text}"
    return f"the output constraint cannot be met with this model's tokenizer: {text}"


def has_open(grammars: list[Grammar | None]) -> bool:
    """Whether any row needs a mask; a step without one pays nothing for structured output."""
    return any(g is not None and g.open for g in grammars)


class BitmaskFiller:
    """Fills a step's [rows, ceil(vocab/32)] int32 bitmask on a worker thread into one of two host buffers,
    pinned where CUDA is so the upload neither copies nor blocks. The buffers take turns: a buffer is
    refilled two steps after its upload was queued, and the host has read a step's tokens in between, so
    that upload has ended."""

    def __init__(self, max_rows: int, vocab_size: int) -> None:
        self._shape = (max(max_rows, 1), (vocab_size + 31) // 32)
        self._buffers: list[torch.Tensor] = []  # made at the first fill: a model never asked for structure pays nothing
        self._next = 0
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer-masks")

    def fill(self, grammars: list[Grammar | None]) -> Future[torch.Tensor]:
        """Each open grammar's allowed tokens; all ones for the other rows (unconstrained, or ending this
        step: their token is dropped). Returns once the worker is inside llguidance."""
        if not self._buffers:
            pinned = torch.cuda.is_available()
            self._buffers = [torch.empty(self._shape, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        mask = self._buffers[self._next][: len(grammars)]
        self._next ^= 1
        mask.numpy().fill(-1)  # numpy's plain memset: a torch CPU op would wake its thread pool, which then spins
        rows = [(g.matcher, row) for row, g in enumerate(grammars) if g is not None and g.open]
        started = threading.Event()
        future = self._worker.submit(_fill, rows, mask, started)
        # The worker needs the GIL until it is inside llguidance; waiting here hands it over now, where the
        # interpreter would otherwise let this thread run on for its 5 ms switch interval first.
        started.wait()
        return future


def _fill(rows: list[tuple[llguidance.LLMatcher, int]], mask: torch.Tensor, started: threading.Event) -> torch.Tensor:
    started.set()
    if rows:  # what llguidance.torch.fill_next_token_bitmask_par calls; that module imports torch.compile's stack
        _executor().unsafe_compute_mask_ptr(rows, mask.data_ptr(), mask.shape[1] * 4, mask.shape[0])
    return mask
