"""Triton varlen prefill attention (interpreted) against the PyTorch reference.

Sequences mix full prefill (q_len == k_len), chunked prefill (queries are the last q_len of k_len
keys), a single-token query and an empty query; several key tiles per sequence exercise the
causal tile skipping and the sliding-window start.
"""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import attention as ref

Q_LENS = [5, 1, 20, 0]
K_LENS = [5, 12, 34, 3]


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("varlen_attention")


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _run(kernels, rng, dtype, causal, window, heads=2, kv_heads=1, head_dim=24):
    q = torch.randn(sum(Q_LENS), heads, head_dim, generator=rng).to(dtype)
    k = torch.randn(sum(K_LENS), kv_heads, head_dim, generator=rng).to(dtype)
    v = torch.randn(sum(K_LENS), kv_heads, head_dim, generator=rng).to(dtype)
    cu_q, cu_k = _cu(Q_LENS), _cu(K_LENS)
    out = kernels.varlen_attention(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(Q_LENS), max_seqlen_k=max(K_LENS),
        causal=causal, scale=head_dim**-0.5, sliding_window=window, cu_seqlens_host=None,
    )
    expected = ref.varlen_attention(q, k, v, cu_q.tolist(), cu_k.tolist(), causal, head_dim**-0.5, window)
    return out, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 7), (False, None)])
def test_varlen_matches_reference(kernels, rng, assert_matches, dtype, causal, window):
    out, expected = _run(kernels, rng, dtype, causal, window)
    assert_matches(out, expected)


def test_bidirectional_window_and_mha(kernels, rng, assert_matches):
    """Without causality a window still hides keys too far in the past; one KV head per query head."""
    out, expected = _run(kernels, rng, torch.float32, False, 9, heads=1, kv_heads=1, head_dim=16)
    assert_matches(out, expected)


def test_strided_qkv_views(kernels, rng, assert_matches):
    """q, k, v sliced out of one fused projection output (token stride > heads * head_dim)."""
    n, heads, kv_heads, d = 9, 4, 1, 16
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=rng)
    q = qkv[:, : heads * d].view(n, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(n, kv_heads, d)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    out = kernels.varlen_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=5, max_seqlen_k=5,
                                   causal=True, scale=0.25, sliding_window=None, cu_seqlens_host=None)
    assert_matches(out, ref.varlen_attention(q, k, v, [0, 4, 9], [0, 4, 9], True, 0.25, None))
