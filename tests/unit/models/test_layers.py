"""LongRoPE's tables: a token reads the long factors' rows exactly when its own sequence is longer than the original
context, whatever else shares the step (prefill chunks, decode rows, padding rows past the last sequence)."""

from __future__ import annotations

import torch

from infer.families.config import RopeConfig
from infer.models.forward_batch import ForwardBatch
from infer.models.layers import RotaryEmbedding, longrope_rows, rope_inv_freq

ROPE = RopeConfig(theta=10000.0, rope_type="longrope", original_max_position_embeddings=8,
                  short_factor=(1.0, 2.0), long_factor=(4.0, 8.0), attention_factor=1.25)


def batch(query_lens: list[int], context_lens: list[int], tokens: int | None = None) -> ForwardBatch:
    """A step's metadata: each sequence's new tokens are the last of its context (`tokens` adds padding rows)."""
    positions = [p for q, c in zip(query_lens, context_lens) for p in range(c - q, c)]
    positions += [0] * ((tokens or len(positions)) - len(positions))
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    return ForwardBatch(is_prefill=True, positions=torch.tensor(positions),
                        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), cu_seqlens_q_host=cu,
                        max_seqlen_q=max(query_lens), context_lens=torch.tensor(context_lens, dtype=torch.int32),
                        max_context_len=max(context_lens))


def test_rows_follow_each_sequence_length() -> None:
    step = batch([3, 10, 1, 2], [3, 10, 9, 8], tokens=18)  # short prompt, long prompt, decode row past 8, chunk at 8
    want = [False] * 3 + [True] * 10 + [True] + [False] * 2 + [False] * 2  # padding rows read the last sequence's
    assert longrope_rows(step, 8).tolist() == want


def test_tables_hold_short_then_long_rows_scaled_by_the_attention_factor() -> None:
    rope = RotaryEmbedding(ROPE, head_dim=4, max_positions=16)
    cos, sin = rope(batch([2, 2], [2, 10]))
    for row, (position, long) in enumerate([(0, False), (1, False), (8, True), (9, True)]):
        angles = position * rope_inv_freq(ROPE, 4, long)
        assert torch.allclose(cos[row], angles.cos() * 1.25) and torch.allclose(sin[row], angles.sin() * 1.25)
