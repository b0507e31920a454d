"""The AMX bf16 GEMM: float32 sums of exact bf16 products against a float64 reference on fresh inputs (rows, outputs
and inputs off the tiles' sizes, bias, both output dtypes), a row's result independent of its batch, its packed
copy following the weight, and where layerzero picks it (skipped where this CPU has no AMX)."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.native import amx

pytestmark = pytest.mark.skipif(not amx.available(), reason="no AMX on this CPU")


def _case(seed: int, rows: int, n: int, k: int, bias: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g) if bias else None
    want = x.double() @ w.double().T + (0 if b is None else b.double())  # the bf16 values, exactly
    return x, w, b, want


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 70), n=st.integers(1, 80),
       k=st.sampled_from([32, 64, 96, 576]), bias=st.booleans())
def test_float32_out_matches_float64(seed: int, rows: int, n: int, k: int, bias: bool) -> None:
    x, w, b, want = _case(seed, rows, n, k, bias)
    got = amx.linear(x.float(), w, b)  # float32 x: rounded to bf16 (exact here: x holds bf16 values)
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


@pytest.mark.parametrize("rows,n", [(16, 576), (37, 49), (128, 3072), (1, 16)])
def test_bf16_out_is_the_float32_sum_rounded(rows: int, n: int) -> None:
    x, w, b, want = _case(rows * n, rows, n, 576, bias=True)
    got = amx.linear(x, w, b)
    assert got.dtype == torch.bfloat16
    sums = amx.linear(x.float(), w, b)  # the same float32 sums, before rounding
    assert torch.equal(got, sums.bfloat16())
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-1)


def test_a_row_gets_the_same_bits_alone_or_in_a_batch() -> None:
    x, w, _, _ = _case(7, 45, 100, 192, bias=False)
    batch = amx.linear(x, w)
    alone = torch.cat([amx.linear(x[i : i + 1], w) for i in range(45)])
    assert torch.equal(batch, alone)


def test_three_dimensional_input_keeps_its_shape() -> None:
    x, w, _, want = _case(3, 6, 40, 64, bias=False)
    got = amx.linear(x.view(2, 3, 64).float(), w)
    assert got.shape == (2, 3, 40)
    torch.testing.assert_close(got.reshape(6, 40).double(), want, rtol=1e-5, atol=1e-4)


def test_in_place_weight_change_repacks_and_the_copy_goes_with_its_weight() -> None:
    gc.collect()
    before = len(amx.PACKED)
    x, w, _, _ = _case(1, 8, 32, 64, bias=False)
    amx.linear(x, w)
    assert len(amx.PACKED) == before + 1
    with torch.no_grad():
        w.mul_(-1)
    torch.testing.assert_close(amx.linear(x.float(), w).double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-4)
    del w
    gc.collect()
    assert len(amx.PACKED) == before


def test_selected_for_bf16_rows_and_float32_rows_past_the_gemv() -> None:
    w = torch.randn(64, 576).bfloat16()
    assert lz.which("linear", torch.randn(16, 576).bfloat16(), w)["kernel_id"] == "native.linear_bf16_amx_cpu"
    assert lz.which("linear", torch.randn(lz.BF16_GEMV_MAX_ROWS + 1, 576), w)["kernel_id"] == \
        "native.linear_bf16_amx_cpu"
    assert lz.which("linear", torch.randn(lz.BF16_GEMV_MAX_ROWS, 576), w)["kernel_id"] == "native.linear_bf16_cpu"
    assert lz.which("linear", torch.randn(amx.MAX_ROWS, 576).bfloat16(), w)["kernel_id"] == "native.linear_bf16_amx_cpu"
    report = lz.explain("linear", torch.randn(amx.MAX_ROWS + 1, 576).bfloat16(), w)
    assert f"past {amx.MAX_ROWS} oneDNN" in str(next(c for c in report.candidates
                                                    if c.kernel_id == "native.linear_bf16_amx_cpu"))
    report = lz.explain("linear", torch.randn(16, 48).bfloat16(), torch.randn(8, 48).bfloat16())
    assert "32 columns a tile" in str(next(c for c in report.candidates if c.kernel_id == "native.linear_bf16_amx_cpu"))
    report = lz.explain("linear", torch.randn(16, 64), torch.randn(8, 64))
    assert "bfloat16 weights only" in str(next(c for c in report.candidates
                                                if c.kernel_id == "native.linear_bf16_amx_cpu"))
