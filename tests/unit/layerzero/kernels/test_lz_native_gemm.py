"""The float32 GEMM for AVX2 CPUs (native f32_gemm.c): against float64 on fresh random shapes (tails of rows and of
16-column panels, odd K, bias), bfloat16 weights widened exactly, a row's bits alone or in a batch, the packed copy
following its weight, and where layerzero picks it (skipped on a CPU whose vectors are not AVX2)."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.native import gemm, linear
from layerzero.kernels.native.build import vector_isa

pytestmark = pytest.mark.skipif(vector_isa() != "AVX2", reason="the GEMM runs on AVX2 CPUs only")


def _case(seed: int, rows: int, n: int, k: int, bias: bool, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g) if bias else None
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    return x, w, b, want


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 70), n=st.integers(1, 80), k=st.integers(1, 700),
       bias=st.booleans(), bf16=st.booleans())
def test_matches_float64(seed: int, rows: int, n: int, k: int, bias: bool, bf16: bool) -> None:
    x, w, b, want = _case(seed, rows, n, k, bias, torch.bfloat16 if bf16 else torch.float32)
    got = gemm.linear(x, w, b)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_bf16_weight_is_the_float32_product_of_its_widened_values() -> None:
    x, w, b, _ = _case(5, 40, 50, 576, bias=True, dtype=torch.bfloat16)
    assert torch.equal(gemm.linear(x, w, b), gemm.linear(x, w.float(), b))


def test_a_row_gets_the_same_bits_alone_or_in_a_batch() -> None:
    x, w, _, _ = _case(7, 200, 100, 192, bias=False)
    batch = gemm.linear(x, w)
    alone = torch.cat([gemm.linear(x[i : i + 1], w) for i in range(0, 200, 13)])
    assert torch.equal(batch[::13], alone)


def test_three_dimensional_input_keeps_its_shape() -> None:
    x, w, _, want = _case(3, 36, 40, 64, bias=False)
    got = gemm.linear(x.view(2, 18, 64), w)
    assert got.shape == (2, 18, 40)
    torch.testing.assert_close(got.reshape(36, 40).double(), want, rtol=1e-5, atol=1e-4)


def test_in_place_weight_change_repacks_and_the_copy_goes_with_its_weight() -> None:
    gc.collect()
    before = len(gemm.PACKED)
    x, w, _, _ = _case(1, 20, 32, 64, bias=False)
    gemm.linear(x, w)
    assert len(gemm.PACKED) == before + 1
    with torch.no_grad():
        w.mul_(-1)
    torch.testing.assert_close(gemm.linear(x, w).double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-4)
    del w
    gc.collect()
    assert len(gemm.PACKED) == before


def test_selected_past_the_gemv_rows_for_float32_and_bf16_weights() -> None:
    rows = linear.F32_MAX_ROWS
    for w in (torch.randn(64, 576), torch.randn(64, 576).bfloat16()):
        assert lz.which("linear", torch.randn(rows + 1, 576), w)["kernel_id"] == "native.linear_f32_gemm_cpu"
        assert lz.which("linear", torch.randn(2048, 576), w)["kernel_id"] == "native.linear_f32_gemm_cpu"
        report = lz.explain("linear", torch.randn(rows, 576), w)
        assert report.selected != "native.linear_f32_gemm_cpu"
        assert f"the GEMVs take up to {rows}" in str(next(c for c in report.candidates
                                                         if c.kernel_id == "native.linear_f32_gemm_cpu"))
