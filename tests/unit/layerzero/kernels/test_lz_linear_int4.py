"""lz.linear_int4: the 4-bit packing, the float64 meaning of a group-quantized weight, and the CPU kernels (native
and torch's packed one) against the reference on fresh random inputs; selection, locking and shape errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.reference.quantize import dequantize_int4, linear_int4, pack_int4, unpack_int4


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 12), st.integers(0, 2**16))
def test_pack_unpack_round_trip(rows: int, half_cols: int, seed: int) -> None:
    q = torch.randint(0, 16, (rows, 2 * half_cols), generator=torch.Generator().manual_seed(seed))
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (rows, half_cols)
    assert torch.equal(unpack_int4(packed), q)
    assert torch.equal(packed[:, 0] & 0xF, q[:, 0].to(torch.uint8))  # the even column in the low nibble


@pytest.mark.parametrize("group", [32, 64, 128])
def test_dequantize_matches_float64(group: int) -> None:
    gen = torch.Generator().manual_seed(group)
    n, k = 48, 256
    q = torch.randint(0, 16, (n, k), generator=gen)
    sz = torch.randn(k // group, n, 2, generator=gen, dtype=torch.float64)
    want = torch.empty(n, k, dtype=torch.float64)
    for r in range(n):
        for c in range(k):
            s, z = sz[c // group, r]
            want[r, c] = (q[r, c] - 8) * s + z
    got = dequantize_int4(pack_int4(q), sz, group)
    assert torch.allclose(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel_id", ["native.linear_int4_cpu", "torch.linear_int4_cpu"])
@pytest.mark.parametrize(("rows", "n", "k", "group", "bias"), [(1, 96, 256, 32, False), (7, 64, 512, 64, True),
                                                                (33, 160, 384, 128, False)])
def test_cpu_kernels_match_the_reference(kernel_id: str, rows: int, n: int, k: int, group: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * n)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen))
    sz = (torch.randn(k // group, n, 2, generator=gen) * 0.05).to(torch.bfloat16).float()  # what torch's kernel keeps
    x = torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    if kernel_id == "native.linear_int4_cpu":  # the default wherever a C compiler builds it
        assert lz.which("linear_int4", x, qweight, sz, b, group_size=group)["kernel_id"] == kernel_id
    lz.lock("linear_int4", kernel_id)
    try:
        got = lz.linear_int4(x, qweight, sz, group, b)
        alone = torch.cat([lz.linear_int4(x[i : i + 1], qweight, sz, group, b) for i in range(rows)])
    finally:
        lz.unlock("linear_int4")
    want = linear_int4(x, qweight, sz, b, group_size=group)
    assert got.dtype == x.dtype and got.shape == (rows, n)
    scale = want.abs().max().item()
    tolerance = 1e-5 if kernel_id.startswith("native") else 5e-3  # float32 throughout / bf16 outputs
    assert (got - want).abs().max().item() <= tolerance * scale
    assert torch.equal(alone, got)  # a row's result does not depend on the rows beside it


def test_lock_to_the_reference_and_shape_errors() -> None:
    qweight = pack_int4(torch.randint(0, 16, (16, 64)))
    sz = torch.randn(2, 16, 2) * 0.1
    x = torch.randn(2, 64)
    lz.lock("linear_int4", "reference.linear_int4")
    try:
        assert lz.which("linear_int4", x, qweight, sz, None, group_size=32)["kernel_id"] == "reference.linear_int4"
        got = lz.linear_int4(x, qweight, sz, 32)
    finally:
        lz.unlock("linear_int4")
    assert torch.allclose(got, linear_int4(x, qweight, sz, None, group_size=32))
    with pytest.raises(ValueError, match="do not fit"):
        lz.linear_int4(torch.randn(2, 32), qweight, sz, 32)
    with pytest.raises(ValueError, match="uint8"):
        lz.linear_int4(x, qweight.to(torch.int32), sz, 32)


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("linear_int4")


# rows: the GEMV (<= 4) and the tl.dot tiles (16 and 128 rows); K: a whole tile, a partial last tile, groups of 64
# and 128 (a GEMV tile of one group); N not a multiple of any tile
@pytest.mark.parametrize("rows", [1, 3, 9, 70])
@pytest.mark.parametrize(("n", "k", "group"), [(40, 96, 32), (70, 320, 64), (24, 256, 128)])
def test_triton_kernels_match_the_reference(kernels, rows: int, n: int, k: int, group: int) -> None:
    gen = torch.Generator().manual_seed(rows + n + k)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen))
    sz = torch.randn(k // group, n, 2, generator=gen) * 0.05
    b = torch.randn(n, generator=gen)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        x = torch.randn(rows, k, generator=gen).to(dtype)
        got = kernels.linear_int4(x, qweight, sz, b, group_size=group)
        want = linear_int4(x.float(), qweight, sz, b, group_size=group)
        assert got.dtype == dtype and got.shape == (rows, n)
        assert (got.float() - want).abs().max() <= rtol * want.abs().max(), dtype

