"""The native kernels that read and write bfloat16 rows while computing in float32 (a CPU bf16 model's prefill keeps
its rows in bf16 between projections): the gated activations and the add of bf16 rows to a float32 residual with
the norm written in bf16. Each must equal its float32 kernel on the widened input, rounded by torch, bit for bit, and
be within bf16's rounding of a float64 reference, on fresh random inputs; layerzero picks them for bf16 rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.native import activation, norm
from layerzero.kernels.reference import activation as act_ref
from layerzero.kernels.reference import norm as norm_ref

BF16_EPS = 2.0**-8  # a bf16 rounding's relative error


def _gated(x: torch.Tensor, act: str) -> torch.Tensor:
    return activation.silu_and_mul(x) if act == "silu" else activation.gelu_and_mul(x, approximate=act)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 9), inner=st.integers(1, 1300),
       act=st.sampled_from(["silu", "tanh", "none"]))
def test_bf16_gated_activation_is_the_float32_kernel_rounded(seed: int, rows: int, inner: int, act: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 2 * inner, generator=gen) * 3).bfloat16()
    got = _gated(x, act)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, inner)
    assert torch.equal(got.view(torch.int16), _gated(x.float(), act).bfloat16().view(torch.int16))
    want = act_ref.silu_and_mul(x.double()) if act == "silu" else act_ref.gelu_and_mul(x.double(), act)
    assert torch.allclose(got.double(), want, rtol=BF16_EPS, atol=1e-6)


def test_bf16_rounding_of_special_values_is_torchs() -> None:
    """Ties, infinities and denormals round as torch's .to(torch.bfloat16) does, NaN stays NaN (torch's own casts
    disagree on a NaN's bits) (up = the value, gate large)."""
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 1e-39, -3e-40, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8,
                             3.0e38, 65504.0, -0.0] * 4)
    up = specials.view(1, -1)
    gate = torch.full_like(up, 100.0)  # silu(100) = 100 in float32: out = 100 * up
    x32 = torch.cat([gate, up], dim=-1)
    got = activation.silu_and_mul(x32.bfloat16())
    want = activation.silu_and_mul(x32.bfloat16().float()).bfloat16()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 40), d=st.integers(1, 1100), offset=st.sampled_from([0.0, 1.0]))
def test_bf16_add_rms_norm_is_the_float32_kernel_rounded(seed: int, rows: int, d: int, offset: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, d, generator=gen) * 2).bfloat16()
    res, w = torch.randn(rows, d, generator=gen) * 5, torch.randn(d, generator=gen)
    x_before, res_before = x.clone(), res.clone()
    normed, summed = norm.fused_add_rms_norm(x, res, w, eps=1e-6, weight_offset=offset)
    assert normed.dtype == torch.bfloat16 and summed.dtype == torch.float32
    assert torch.equal(summed, x.float() + res)
    want32, _ = norm.fused_add_rms_norm(x.float(), res, w, eps=1e-6, weight_offset=offset)
    assert torch.equal(normed.view(torch.int16), want32.bfloat16().view(torch.int16))
    s = x.double() + res.double()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * (w.double() + offset)
    assert torch.allclose(normed.double(), ref, rtol=BF16_EPS, atol=1e-4 * ref.abs().max().item())
    assert torch.equal(x, x_before) and torch.equal(res, res_before)  # the inputs are left alone


def test_layerzero_picks_the_bf16_kernels_for_bf16_rows() -> None:
    x, w = torch.randn(8, 2 * 64).bfloat16(), torch.ones(64)
    assert lz.which("silu_and_mul", x)["kernel_id"] == "native.silu_and_mul_bf16_cpu"
    assert lz.which("gelu_and_mul", x, approximate="tanh")["kernel_id"] == "native.gelu_and_mul_bf16_cpu"
    rows, stream = torch.randn(8, 64).bfloat16(), torch.randn(8, 64)
    assert lz.which("fused_add_rms_norm", rows, stream, w, eps=1e-6, weight_offset=0.0)["kernel_id"] == (
        "native.add_rms_norm_bf16_cpu")
    report = lz.explain("fused_add_rms_norm", rows, stream.bfloat16(), w, eps=1e-6, weight_offset=0.0)
    native = next(c for c in report.candidates if c.kernel_id == "native.add_rms_norm_bf16_cpu")
    assert not native.valid and "bfloat16 residual" in str(native.reasons)


@pytest.mark.parametrize("residual_dtype", [torch.float32, torch.bfloat16])
def test_the_reference_add_norm_returns_the_norm_in_xs_dtype(residual_dtype: torch.dtype) -> None:
    x, res, w = torch.randn(3, 16).bfloat16(), torch.randn(3, 16).to(residual_dtype), torch.randn(16)
    normed, summed = norm_ref.fused_add_rms_norm(x, res, w, 1e-6, 0.0)
    assert normed.dtype == torch.bfloat16 and summed.dtype == residual_dtype
