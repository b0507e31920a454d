"""lz.linear_w8: the float64 meaning of an 8-bit weight with block scales, the CPU int8 kernel and the Triton kernels
(interpreted) against the reference on fresh random inputs; selection, locking and shape errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.reference.quantize import dequantize_w8, linear_w8

FP8 = torch.float8_e4m3fn


def _weight(gen: torch.Generator, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    return (torch.randn(n, k, generator=gen) * 100).clamp(-448, 448).to(FP8)


def _scale(gen: torch.Generator, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    return torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) * 0.01 + 1e-4


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 48), st.integers(1, 48), st.sampled_from(["int8", "fp8"]),
       st.integers(0, 2**16))
def test_dequantize_matches_float64(n: int, k: int, bn: int, bk: int, fmt: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = _weight(gen, n, k, torch.int8 if fmt == "int8" else FP8)
    s = _scale(gen, n, k, (bn, bk)).double()
    want = torch.empty(n, k, dtype=torch.float64)
    for r in range(n):
        for c in range(k):
            want[r, c] = float(w[r, c].float()) * s[r // bn, c // bk]
    assert torch.allclose(dequantize_w8(w, s.float(), (bn, bk)).double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kernel_id", ["native.linear_w8_int8_cpu", "torch.linear_w8_int8_cpu"])
@pytest.mark.parametrize(("rows", "n", "k", "bias"), [(1, 96, 256, False), (7, 64, 576, True), (33, 160, 384, False)])
def test_cpu_int8_kernels_match_the_reference(kernel_id: str, rows: int, n: int, k: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * n)
    w, s = _weight(gen, n, k, torch.int8), _scale(gen, n, k, (1, k))
    x = torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    if kernel_id.startswith("native"):  # the default wherever a C compiler builds it
        assert lz.which("linear_w8", x, w, s, b, block_size=(1, k))["kernel_id"] == kernel_id
    lz.lock("linear_w8", kernel_id)
    try:
        got = lz.linear_w8(x, w, s, (1, k), b)
    finally:
        lz.unlock("linear_w8")
    want = linear_w8(x, w, s, b, block_size=(1, k))
    # native: float32 throughout; torch: two bfloat16 passes of x, each rounded to bfloat16 (~2^-9 of the largest)
    tolerance = 1e-5 if kernel_id.startswith("native") else 4e-3
    assert (got - want).abs().max() <= tolerance * want.abs().max()


def test_cpu_int8_kernel_is_row_by_row() -> None:
    gen = torch.Generator().manual_seed(5)
    w, s = _weight(gen, 64, 128, torch.int8), _scale(gen, 64, 128, (1, 128))
    x = torch.randn(9, 128, generator=gen)
    together = lz.linear_w8(x, w, s, (1, 128))
    assert all(torch.equal(together[i], lz.linear_w8(x[i : i + 1], w, s, (1, 128))[0]) for i in range(9))


def test_blocks_and_fp8_take_the_reference_on_the_cpu() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 256, generator=gen)
    w8, s = _weight(gen, 64, 256, torch.int8), _scale(gen, 64, 256, (128, 128))
    assert lz.which("linear_w8", x, w8, s, None, block_size=(128, 128))["kernel_id"] == "reference.linear_w8"
    f8 = _weight(gen, 64, 256, FP8)
    why = str(lz.explain("linear_w8", x, f8, s, None, block_size=(128, 128)))
    assert "QUANT_FORMAT_UNSUPPORTED" in why and "reference.linear_w8" in why
    channel = _scale(gen, 64, 256, (1, 256))
    lz.lock("linear_w8", "reference.linear_w8")
    try:
        assert lz.which("linear_w8", x, w8, channel, None, block_size=(1, 256))["kernel_id"] == "reference.linear_w8"
        got = lz.linear_w8(x, w8, channel, (1, 256))
    finally:
        lz.unlock("linear_w8")
    assert torch.equal(got, linear_w8(x, w8, channel, None, block_size=(1, 256)))


@pytest.mark.parametrize(("shape", "block", "message"), [
    ((64, 256), (1, 128), "do not fit"),  # scale [64, 1] for blocks of 128 columns
    ((64, 250), (1, 256), "do not fit"),  # x has 256 columns
])
def test_shape_errors_name_the_mismatch(shape, block, message) -> None:
    w = torch.zeros(shape, dtype=torch.int8)
    with pytest.raises(ValueError, match=message):
        lz.linear_w8(torch.randn(1, 256), w, torch.ones(64, 1), block)


def test_weight_dtype_is_checked() -> None:
    with pytest.raises(ValueError, match="int8 or float8_e4m3fn"):
        lz.linear_w8(torch.randn(1, 8), torch.zeros(4, 8), torch.ones(4, 1), (1, 8))


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("linear_w8")


# rows: the GEMV (<= 4) and the tl.dot tiles (16, 64, 128 rows); blocks: per channel, 128 x 128 with a partial last
# row block, columns in blocks of 32 (a tile narrower than the kernel's default), one scale for all
@pytest.mark.parametrize("rows", [1, 3, 9, 70])
@pytest.mark.parametrize(("n", "k", "block"), [(40, 96, (1, 96)), (300, 256, (128, 128)), (64, 100, (1, 32)),
                                               (24, 48, (24, 48))])
@pytest.mark.parametrize("wdtype", [torch.int8, FP8], ids=["int8", "fp8"])
def test_triton_kernels_match_the_reference(kernels, rows, n, k, block, wdtype) -> None:
    gen = torch.Generator().manual_seed(rows + n + k)
    w, s = _weight(gen, n, k, wdtype), _scale(gen, n, k, block)
    b = torch.randn(n, generator=gen)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = torch.randn(rows, k, generator=gen).to(dtype)
        got = kernels.linear_w8(x, w, s, b, block_size=block)
        want = linear_w8(x.float(), w, s, b, block_size=block)
        assert got.dtype == dtype
        assert (got.float() - want).abs().max() <= rtol * want.abs().max(), dtype


@pytest.mark.parametrize("split", [2, 3])
def test_a_split_k_sums_its_partials(kernels, split) -> None:
    from layerzero.kernels.triton.linear_w8 import TileConfig

    gen = torch.Generator().manual_seed(split)
    w, s = _weight(gen, 40, 200, torch.int8), _scale(gen, 40, 200, (1, 32))
    x, b = torch.randn(20, 200, generator=gen), torch.randn(40, generator=gen)
    got = kernels.linear_w8(x, w, s, b, block_size=(1, 32), config=TileConfig(16, 32, 32, 4, 2, split))
    want = linear_w8(x, w, s, b, block_size=(1, 32))
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
