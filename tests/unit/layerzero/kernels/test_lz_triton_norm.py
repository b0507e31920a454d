"""Triton RMSNorm and fused residual-add + RMSNorm (interpreted) against the PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.reference import norm as ref

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [576, 8193])  # one tile in registers; two passes over a longer row
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_reference(kernels, rng, assert_matches, dtype, hidden, offset):
    x = torch.randn(1, 2, hidden, generator=rng).to(dtype)
    w = (torch.randn(hidden, generator=rng) * 0.5).to(dtype)
    out = kernels.rms_norm(x, w, eps=1e-6, weight_offset=offset)
    assert_matches(out, ref.rms_norm(x, w, 1e-6, offset))


def test_rms_norm_of_a_strided_head_view(kernels, rng, assert_matches):
    """QK-norm on q sliced out of a fused QKV output: rows are (token, head) with two strides."""
    qkv = torch.randn(5, (4 + 2 * 2) * 64, generator=rng)
    q = qkv[:, : 4 * 64].view(5, 4, 64)
    w = torch.randn(64, generator=rng)
    assert not q.is_contiguous()
    assert_matches(kernels.rms_norm(q, w, eps=1e-5, weight_offset=0.0), ref.rms_norm(q, w, 1e-5, 0.0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1152, 8200])
def test_fused_add_rms_norm_matches_reference_and_leaves_inputs(kernels, rng, assert_matches, dtype, hidden):
    x = torch.randn(2, hidden, generator=rng).to(dtype)
    residual = torch.randn(2, hidden, generator=rng).to(dtype)
    w = torch.randn(hidden, generator=rng).to(dtype)
    x0, r0 = x.clone(), residual.clone()
    normed, summed = kernels.fused_add_rms_norm(x, residual, w, eps=1e-6, weight_offset=1.0)
    ref_normed, ref_summed = ref.fused_add_rms_norm(x, residual, w, 1e-6, 1.0)
    assert_matches(summed, ref_summed)
    assert_matches(normed, ref_normed)
    assert torch.equal(x, x0) and torch.equal(residual, r0)


def test_fused_add_promotes_like_torch(kernels, rng, assert_matches):
    """A bfloat16 branch added to a float32 residual stream: the sum in float32, as `x + residual` is, the norm in
    bfloat16 for the next bf16 matmul."""
    x = torch.randn(4, 96, generator=rng).to(torch.bfloat16)
    residual = torch.randn(4, 96, generator=rng)
    w = torch.randn(96, generator=rng)
    normed, summed = kernels.fused_add_rms_norm(x, residual, w, eps=1e-6, weight_offset=0.0)
    ref_normed, ref_summed = ref.fused_add_rms_norm(x, residual, w, 1e-6, 0.0)
    assert_matches(summed, ref_summed)
    assert_matches(normed, ref_normed)
    assert (summed.dtype, normed.dtype) == (torch.float32, torch.bfloat16)


def test_weight_shape_is_checked(kernels):
    with pytest.raises(ValueError, match="weight"):
        kernels.rms_norm(torch.randn(2, 8), torch.randn(7), eps=1e-6, weight_offset=0.0)
