"""The token bitmask of one step: a row per sequence, all ones for sequences without a constraint."""

from __future__ import annotations

import llguidance
import llguidance.torch
import torch


def step_bitmask(matchers: list[llguidance.LLMatcher | None], vocab_size: int) -> torch.Tensor | None:
    """[rows, ceil(vocab/32)] int32 on the host, or None when no row is constrained (then nothing is paid)."""
    if all(m is None for m in matchers):
        return None
    mask = torch.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=torch.int32)
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            llguidance.torch.fill_next_token_bitmask(matcher, mask, row)
    return mask
