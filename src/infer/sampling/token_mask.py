"""Apply a structured-output token mask (llguidance's bitmask layout) to logits on their device."""

from __future__ import annotations

import torch


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [B, V] to -inf where bit (id % 32) of word bitmask[row, id // 32] is 0; in place, no sync.

    `bitmask` [B, W] int32 lives on the host (pinned by its maker where CUDA is, so the upload is
    asynchronous); ids at or past 32 * W (padding rows of an LM head wider than the tokenizer) are never allowed.
    """
    words = bitmask.to(logits.device, non_blocking=bitmask.is_pinned())
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).flatten(1).bool()  # [B, 32 * W]
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    logits.masked_fill_(~allowed[:, :vocab], float("-inf"))
