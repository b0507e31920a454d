"""Triton paged decode attention (interpreted) against the PyTorch reference, single pass and split-K."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import attention as ref

BLOCK_SIZE, NUM_BLOCKS = 4, 24
CONTEXT_LENS = [17, 1, 30]  # mid-block, a single token, many blocks


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("paged_attention")


def _inputs(rng, dtype, heads=4, kv_heads=1, head_dim=32, context_lens=CONTEXT_LENS):
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim, generator=rng).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim, generator=rng).to(dtype)
    width = -(-max(context_lens) // BLOCK_SIZE)
    # physical blocks scattered at random over the pool, never in order
    tables = torch.randperm(NUM_BLOCKS, generator=rng)[: len(context_lens) * width].view(len(context_lens), width)
    q = torch.randn(len(context_lens), heads, head_dim, generator=rng).to(dtype)
    return q, k_cache, v_cache, tables.int(), torch.tensor(context_lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("splits", [1, 3])
def test_paged_matches_reference(kernels, rng, assert_matches, dtype, window, splits):
    q, kc, vc, tables, ctx = _inputs(rng, dtype)
    out = kernels.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=0.2,
                                  sliding_window=window, max_context_len=max(CONTEXT_LENS), num_splits=splits)
    assert_matches(out, ref.paged_attention(q, kc, vc, tables, ctx, 0.2, window, max(CONTEXT_LENS)))


def test_more_splits_than_tiles_and_mha(kernels, rng, assert_matches):
    """Splits with no keys contribute nothing; one query head per KV head (group of 1)."""
    q, kc, vc, tables, ctx = _inputs(rng, torch.float32, heads=2, kv_heads=2, head_dim=16, context_lens=[3, 9])
    out = kernels.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=0.25,
                                  sliding_window=None, max_context_len=9, num_splits=5)
    assert_matches(out, ref.paged_attention(q, kc, vc, tables, ctx, 0.25, None, 9))


def test_padding_sequence_gives_zeros(kernels, rng):
    """A batch row with context_len 0 (CUDA-graph padding) outputs zeros instead of NaN."""
    q, kc, vc, tables, _ = _inputs(rng, torch.float32, context_lens=[5, 8])
    ctx = torch.tensor([0, 8], dtype=torch.int32)
    for splits in (1, 2):
        out = kernels.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=0.2,
                                      sliding_window=None, max_context_len=8, num_splits=splits)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.isfinite(out[1]).all()


def test_split_choice(kernels):
    """Few (sequence, KV head) pairs on a large GPU split long contexts; full grids and short contexts do not."""
    assert kernels.choose_splits(batch=1, kv_heads=8, max_len=4096, sms=132) == 33  # two programs an SM
    assert kernels.choose_splits(batch=1, kv_heads=8, max_len=1024, sms=132) == 16  # 64 keys a split at least
    assert kernels.choose_splits(batch=1, kv_heads=1, max_len=100_000, sms=132) == 64
    assert kernels.choose_splits(batch=64, kv_heads=8, max_len=4096, sms=132) == 1
    assert kernels.choose_splits(batch=1, kv_heads=8, max_len=128, sms=132) == 2
    assert kernels.choose_splits(batch=1, kv_heads=8, max_len=64, sms=132) == 1


def test_empty_splits_are_neither_run_nor_read(kernels, rng, assert_matches, nan_fresh_tensors):
    """A capacity of many splits over short contexts: the splits past a sequence's keys return at once and write
    nothing, and the merge reads only the splits that hold keys (the partials' unwritten slots hold NaN here)."""
    q, kc, vc, tables, ctx = _inputs(rng, torch.float32, context_lens=[3, 30, 17])
    for window in (None, 6):
        out = kernels.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=0.2,
                                      sliding_window=window, max_context_len=96, num_splits=8)
        assert_matches(out, ref.paged_attention(q, kc, vc, tables, ctx, 0.2, window, 96))
