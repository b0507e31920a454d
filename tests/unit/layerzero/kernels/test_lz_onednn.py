"""The oneDNN CPU linear: exact against a float64 reference on fresh inputs (bfloat16 within its rounding), selected
for float32 and, where the CPU has bf16 dot products, bfloat16 on the CPU, and its packed weights follow the weights
(repacked on change, dropped when collected)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

import layerzero as lz
from layerzero.kernels import onednn
from layerzero.kernels.native import amx
from layerzero.kernels.native.build import vector_isa
from layerzero.kernels.native.linear import F32_MAX_ROWS

pytestmark = pytest.mark.skipif(onednn._available() is not None, reason="no oneDNN linear in this torch build")


@pytest.mark.parametrize("shape", [(1, 64), (16, 576), (3, 5, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_a_float64_reference(shape, bias):
    g = torch.Generator().manual_seed(sum(shape) + bias)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(200, shape[-1], generator=g)
    b = torch.randn(200, generator=g) if bias else None
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    got = onednn.linear(x, w, b)
    assert got.shape == (*shape[:-1], 200) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_in_place_weight_change_repacks():
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    onednn.linear(x, w)
    with torch.no_grad():
        w.mul_(-2)
    torch.testing.assert_close(onednn.linear(x, w), F.linear(x, w))


def test_packed_copy_goes_with_its_weight():
    gc.collect()  # weights earlier tests left in garbage cycles: their copies go now, not during the count below
    before = len(onednn.PACKED)
    w = torch.randn(8, 32)
    onednn.linear(torch.randn(2, 32), w)
    assert len(onednn.PACKED) == before + 1
    del w
    gc.collect()
    assert len(onednn.PACKED) == before


BF16 = onednn.bf16_gemm()


@pytest.mark.skipif(not BF16, reason="oneDNN has no bfloat16 kernels for this CPU")
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_bfloat16_within_its_rounding(rows):
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 576, generator=g).bfloat16(), torch.randn(300, 576, generator=g).bfloat16(), None
    got = onednn.linear(x, w, b)
    assert got.dtype == torch.bfloat16
    want = F.linear(x.double(), w.double())  # exact products of the bf16 values; the output rounds once to bf16
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_selected_for_float32_and_bfloat16_on_the_cpu():
    x, w = torch.randn(F32_MAX_ROWS + 1, 32), torch.randn(8, 32)  # past the native float32 GEMV's (a decode's) rows
    # an AVX2 CPU's float32 rows go to the native GEMM (tests/unit/layerzero/kernels/test_lz_native_gemm.py)
    want = "native.linear_f32_gemm_cpu" if vector_isa() == "AVX2" else "onednn.linear"
    assert lz.which("linear", x, w)["kernel_id"] == want
    # bf16 goes to the AMX GEMM where the CPU has AMX (tests/unit/layerzero/kernels/test_lz_native_amx.py)
    assert (lz.which("linear", x.bfloat16(), w.bfloat16())["kernel_id"] == "onednn.linear") == (not amx.available())
    assert lz.which("linear", x.half(), w.half())["kernel_id"] != "onednn.linear"


@pytest.mark.parametrize("rows", [5, 40])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_bf16_weights_without_bf16_kernels_multiply_in_float32(monkeypatch, rows, x_dtype):
    """A CPU without AVX512-BF16/AMX (forced here): the weight's packed copy is float32, each value widened exactly,
    so the product is float32's of the bf16 values; the output takes x's dtype."""
    monkeypatch.setattr(onednn, "bf16_gemm", lambda: False)
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 576, generator=g).to(x_dtype), torch.randn(300, 576, generator=g).bfloat16(), None
    got = onednn.linear(x, w, b)
    assert got.dtype == x_dtype
    assert onednn.PACKED.get(w, lambda: None).dtype == torch.float32
    want = F.linear(x.double(), w.double())
    if x_dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    else:  # one rounding of the float32 sums to bf16
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


@pytest.mark.skipif(not BF16, reason="oneDNN has no bfloat16 kernels for this CPU")
def test_float32_rows_times_bf16_weights_round_the_rows_and_return_float32():
    g = torch.Generator().manual_seed(5)
    x, w, b = torch.randn(40, 576, generator=g), torch.randn(300, 576, generator=g).bfloat16(), torch.randn(300)
    got = onednn.linear(x, w, b)
    assert got.dtype == torch.float32
    want = F.linear(x.bfloat16().double(), w.double(), b.double())  # the rows rounded to bf16, the products exact
    torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    past_gemv = "native.linear_bf16_amx_cpu" if amx.available() else "onednn.linear"
    assert lz.which("linear", x, w)["kernel_id"] == past_gemv  # 40 rows: past the native GEMV's 4
