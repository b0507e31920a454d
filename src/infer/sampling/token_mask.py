"""Apply a structured-output token mask (llguidance's bitmask layout) to logits on their device."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _refused_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: bit j of byte value b is 0 (that token is refused)."""
    byte = torch.arange(256, dtype=torch.int32, device=device).unsqueeze(1)  # made there: no upload, no sync
    return (byte >> torch.arange(8, dtype=torch.int32, device=device)) & 1 == 0


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [B, V] to -inf where bit (id % 32) of word bitmask[row, id // 32] is 0; in place, no sync.

    `bitmask` [B, W] int32 lives on the host (pinned by its maker where CUDA is, so the upload is
    asynchronous); ids at or past 32 * W (padding rows of an LM head wider than the tokenizer) are never
    allowed. Three device ops: the upload, a table lookup per byte of the (little-endian) words, the fill.
    """
    words = bitmask.to(logits.device, non_blocking=bitmask.is_pinned())
    # byte k of word w holds the bits of ids 32w + 8k .. 32w + 8k + 7
    refused = _refused_bits(logits.device)[words.view(torch.uint8).long()].flatten(1)  # [B, 32 * W]
    covered = min(refused.shape[1], logits.shape[-1])
    logits[:, :covered].masked_fill_(refused[:, :covered], float("-inf"))
    if covered < logits.shape[-1]:
        logits[:, covered:] = float("-inf")
