"""Paged prefill attention: chunks attend to themselves and to earlier cached tokens through block tables.

The reference is checked against float64 dense attention over the unpaged keys; the Triton kernel
(interpreted) against the reference; `lz.paged_prefill_attention` end to end on the CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference import attention as ref

BLOCK_SIZE, NUM_BLOCKS = 4, 40
# (new tokens, cached tokens after the step): a whole prompt, a chunk after earlier chunks, a decode row
SEQS = [(7, 7), (5, 18), (1, 11)]


def _inputs(rng, dtype, heads=4, kv_heads=2, head_dim=16, seqs=SEQS):
    """Random caches with each sequence's blocks scattered over the pool, plus its unpaged keys/values."""
    k_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim, generator=rng).to(dtype)
    v_cache = torch.randn(NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_dim, generator=rng).to(dtype)
    width = max(-(-ctx // BLOCK_SIZE) for _, ctx in seqs)
    tables = torch.randperm(NUM_BLOCKS, generator=rng)[: len(seqs) * width].view(len(seqs), width).int()
    q = torch.randn(sum(n for n, _ in seqs), heads, head_dim, generator=rng).to(dtype)
    bounds = [0]
    for n, _ in seqs:
        bounds.append(bounds[-1] + n)
    ctx = [c for _, c in seqs]
    return q, k_cache, v_cache, tables, bounds, ctx


def _dense64(q, k_cache, v_cache, tables, bounds, ctx, scale, window):
    """Float64 attention per sequence over its keys read position by position from the block table."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k_cache.shape[2]
    for i, c in enumerate(ctx):
        rows = [(int(tables[i, p // BLOCK_SIZE]), p % BLOCK_SIZE) for p in range(c)]
        k = torch.stack([k_cache[b, o] for b, o in rows]).double().repeat_interleave(group, dim=1)
        v = torch.stack([v_cache[b, o] for b, o in rows]).double().repeat_interleave(group, dim=1)
        for t in range(bounds[i], bounds[i + 1]):
            pos = c - (bounds[i + 1] - bounds[i]) + (t - bounds[i])
            visible = [j for j in range(c) if j <= pos and (window is None or pos - j < window)]
            s = torch.einsum("hd,jhd->hj", q[t].double(), k[visible]) * scale
            out[t] = torch.einsum("hj,jhd->hd", s.softmax(-1), v[visible])
    return out


@pytest.mark.parametrize("window", [None, 5])
def test_reference_matches_float64(rng, window):
    q, kc, vc, tables, bounds, ctx = _inputs(rng, torch.float32)
    out = ref.paged_prefill_attention(q, kc, vc, tables, bounds, ctx, 0.3, window)
    torch.testing.assert_close(out.double(), _dense64(q, kc, vc, tables, bounds, ctx, 0.3, window),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_triton_matches_reference(triton_interpreted, rng, assert_matches, dtype, window):
    kernels = triton_interpreted("varlen_attention")
    q, kc, vc, tables, bounds, ctx = _inputs(rng, dtype)
    out = kernels.paged_prefill_attention(
        q, kc, vc, block_tables=tables, cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32),
        context_lens=torch.tensor(ctx, dtype=torch.int32), max_seqlen_q=7, max_context_len=18, scale=0.3,
        sliding_window=window,
    )
    assert_matches(out, ref.paged_prefill_attention(q, kc, vc, tables, bounds, ctx, 0.3, window))


def test_lz_op_on_cpu_with_host_bounds(rng):
    q, kc, vc, tables, bounds, ctx = _inputs(rng, torch.float32)
    out = lz.paged_prefill_attention(
        q, kc, vc, tables, torch.tensor(bounds, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32),
        max_seqlen_q=7, max_context_len=18, host_bounds=(bounds, ctx),
    )
    expected = _dense64(q, kc, vc, tables, bounds, ctx, 1 / math.sqrt(q.shape[-1]), None)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_context_beyond_the_tables_is_refused(rng):
    q, kc, vc, tables, bounds, ctx = _inputs(rng, torch.float32)
    with pytest.raises(ValueError, match="exceeds the block tables' capacity"):
        lz.paged_prefill_attention(q, kc, vc, tables, torch.tensor(bounds, dtype=torch.int32),
                                   torch.tensor(ctx, dtype=torch.int32), 7, 10_000)


def test_triton_padded_like_a_captured_graph(triton_interpreted, rng, assert_matches):
    """The shapes a prefill graph replays: query rows past the last sequence and sequences of length 0 (padding)
    do no work, and sequences spanning several query tiles at unaligned offsets are covered by the flat grid."""
    kernels = triton_interpreted("varlen_attention")
    seqs = [(37, 40), (1, 11), (20, 20), (3, 9)]
    q, kc, vc, tables, bounds, ctx = _inputs(rng, torch.float32, seqs=seqs)
    pad_rows, pad_seqs = 29, 3
    q_padded = torch.cat([q, torch.randn(pad_rows, *q.shape[1:], generator=rng)])
    tables_padded = torch.cat([tables, torch.zeros(pad_seqs, tables.shape[1], dtype=tables.dtype)])
    out = kernels.paged_prefill_attention(
        q_padded, kc, vc, block_tables=tables_padded,
        cu_seqlens_q=torch.tensor(bounds + [bounds[-1]] * pad_seqs, dtype=torch.int32),
        context_lens=torch.tensor(ctx + [0] * pad_seqs, dtype=torch.int32), max_seqlen_q=q_padded.shape[0],
        max_context_len=40, scale=0.3, sliding_window=None,
    )
    assert_matches(out[: q.shape[0]], ref.paged_prefill_attention(q, kc, vc, tables, bounds, ctx, 0.3, None))
