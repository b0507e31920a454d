"""The token bitmask of one step: a row per sequence, all ones for sequences without a constraint."""

from __future__ import annotations

import functools
from collections.abc import Callable
from functools import partial

import llguidance
import llguidance.torch
import torch


@functools.cache
def _executor() -> llguidance.LLExecutor:
    """llguidance's thread pool: the rows of a step are filled in parallel."""
    return llguidance.LLExecutor()


def step_bitmask(matchers: list[llguidance.LLMatcher | None], vocab_size: int) -> Callable[[], torch.Tensor] | None:
    """What computes the step's mask (for StepInput.token_bitmask), or None when no row is constrained, so an
    unconstrained step pays nothing. The matchers must not advance before the runner calls it."""
    if all(m is None for m in matchers):
        return None
    return partial(_fill, matchers, vocab_size)


def _fill(matchers: list[llguidance.LLMatcher | None], vocab_size: int) -> torch.Tensor:
    """[rows, ceil(vocab/32)] int32 on the host, pinned where CUDA is (filled once, uploaded without a copy);
    all ones for rows without a constraint."""
    mask = torch.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=torch.int32,
                      pin_memory=torch.cuda.is_available())
    rows = [(matcher, row) for row, matcher in enumerate(matchers) if matcher is not None]
    if len(rows) == 1:
        llguidance.torch.fill_next_token_bitmask(rows[0][0], mask, rows[0][1])
    else:
        llguidance.torch.fill_next_token_bitmask_par(_executor(), rows, mask)
    return mask
