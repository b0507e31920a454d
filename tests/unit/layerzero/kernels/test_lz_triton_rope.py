"""Triton RoPE (interpreted) against the PyTorch reference: neox and interleaved, strided inputs, odd head counts."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import rope as ref


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("rope")


def _angles(rng: torch.Generator, tokens: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(tokens, half, generator=rng) * 50.0
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_reference(kernels, rng, assert_matches, dtype, interleaved):
    # head_dim 24: D/2 = 12 is not a power of two; 3 heads are not either
    x = torch.randn(5, 3, 24, generator=rng).to(dtype)
    cos, sin = _angles(rng, 5, 12)
    assert_matches(kernels.rope(x, cos, sin, interleaved=interleaved), ref.rope(x, cos, sin, interleaved))


def test_rope_of_a_strided_view_with_many_heads(kernels, rng, assert_matches):
    """k sliced out of a fused QKV output; more heads than one program's block (several head blocks)."""
    tokens, heads, d = 3, 40, 128
    qkv = torch.randn(tokens, 2 * heads * d, generator=rng)
    k = qkv[:, heads * d :].view(tokens, heads, d)
    cos, sin = _angles(rng, tokens, d // 2)
    assert_matches(kernels.rope(k, cos, sin, interleaved=False), ref.rope(k, cos, sin, False))


def test_rope_rejects_mismatched_tables(kernels):
    with pytest.raises(ValueError, match="cos/sin"):
        kernels.rope(torch.randn(2, 1, 8), torch.randn(2, 3), torch.randn(2, 3), interleaved=False)
