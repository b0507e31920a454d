"""The skinny-linear Triton kernels (decode's batch 1-8: the GEMV and its split-K form) against float64 on fresh
random inputs, interpreted on the CPU, and the rules that let them run only where they measured faster than
cuBLAS."""

from __future__ import annotations

import pytest
import torch

from layerzero.kernels.triton import specs
from layerzero.select.context import SelectionContext


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "n", "k", "bias"), [(1, 48, 256, False), (8, 100, 384, True), (20, 33, 130, True)])
def test_gemv_matches_float64(triton_interpreted, rng, assert_matches, dtype, rows, n, k, bias):
    gemv = triton_interpreted("gemv")
    x = torch.randn(rows, k + 3, generator=rng).to(dtype)[:, :k]  # a strided view: rows 3 elements apart
    w = (torch.randn(n, k, generator=rng) * 0.1).to(dtype)
    b = torch.randn(n, generator=rng).to(dtype) if bias else None
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    got = gemv.linear_gemv(x, w, b)
    assert_matches(got, want.to(dtype))


def test_gemv_keeps_leading_dims(triton_interpreted, rng):
    gemv = triton_interpreted("gemv")
    x, w = torch.randn(2, 3, 64, generator=rng), torch.randn(40, 64, generator=rng)
    assert gemv.linear_gemv(x, w).shape == (2, 3, 40)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "n", "k", "bias"), [(1, 48, 1024, False), (8, 100, 2048, True), (16, 70, 1024, True)])
def test_splitk_matches_float64(triton_interpreted, rng, assert_matches, dtype, rows, n, k, bias):
    """Every slice of K counted once, in order; rows past the first masked; the bias added once."""
    gemv = triton_interpreted("gemv")
    x = torch.randn(rows, k + 3, generator=rng).to(dtype)[:, :k]
    w = (torch.randn(n, k, generator=rng) * 0.1).to(dtype)
    b = torch.randn(n, generator=rng).to(dtype) if bias else None
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    assert_matches(gemv.linear_splitk(x, w, b), want.to(dtype))


def test_splitk_refuses_what_it_cannot_split(triton_interpreted, rng):
    gemv = triton_interpreted("gemv")
    with pytest.raises(ValueError, match="multiple of"):
        gemv.linear_splitk(torch.randn(1, 1000, generator=rng), torch.randn(8, 1000, generator=rng))
    with pytest.raises(ValueError, match="at most 16 rows"):
        gemv.linear_splitk(torch.randn(17, 1024, generator=rng), torch.randn(8, 1024, generator=rng))


def _ctx(tokens: int, out: int, hidden: int) -> SelectionContext:
    return SelectionContext(op="linear", platform="cuda", device="cuda", dtype=torch.bfloat16, tokens=tokens,
                            hidden=hidden, params=(("out_features", out), ("bias", False)))


def test_the_gemv_runs_on_few_rows_of_weights_from_64_mib_or_long_rows_that_do_not_slice():
    check = next(s for s in specs.kernel_specs() if s.kernel_id == "triton.linear").check
    assert check is not None
    assert check(_ctx(1, 14336 * 2, 4096)) == []  # Llama-3.1-8B gate+up, batch 1
    assert check(_ctx(8, 128256, 2048)) == []  # Llama-3.2-1B LM head, batch 8
    assert check(_ctx(1, 4096, 4096 + 512)) == []  # 36 MiB of rows the split-K form cannot slice
    assert "split-K" in check(_ctx(1, 3072, 4096))[0].message  # Llama-3.1-8B's QKV shard at TP=2: split-K's
    assert "split-K" in check(_ctx(1, 2048, 4096 + 512))[0].message  # unsliced, but 2048 outputs
    assert "at most 8" in check(_ctx(16, 14336 * 2, 4096))[0].message
    assert "cuBLAS" in check(_ctx(1, 3072, 2048))[0].message  # Llama-3.2-1B QKV: 12 MiB
    assert "cuBLAS" in check(_ctx(1, 2048, 8192))[0].message  # Llama-3.2-1B down: 2048 outputs
    assert "cuBLAS" in check(_ctx(1, 5120, 2048))[0].message  # Qwen3-30B-A3B QKV: rows of 2048


def test_the_splitk_gemv_runs_on_long_rows_of_16_to_64_mib():
    check = next(s for s in specs.kernel_specs() if s.kernel_id == "triton.linear_splitk").check
    gemv = next(s for s in specs.kernel_specs() if s.kernel_id == "triton.linear").check
    assert check is not None and gemv is not None
    assert check(_ctx(1, 2048, 4096)) == []  # Qwen3-30B-A3B's O projection: 16 MiB
    assert check(_ctx(8, 2048, 8192)) == []  # Llama-3.2-1B down: 32 MiB
    assert check(_ctx(1, 3072, 4096)) == []  # Llama-3.1-8B's QKV shard at TP=2: 24 MiB
    assert check(_ctx(1, 4096, 7168)) == []  # its down shard: 56 MiB
    assert check(_ctx(1, 6144, 4096)) == [] and check(_ctx(1, 4096, 4096)) == []  # the 8B's QKV and O at TP=1
    assert "16 to 64 MiB" in check(_ctx(1, 4096, 14336))[0].message  # the 8B's down: 112 MiB, the GEMV's
    assert "16 to 64 MiB" in check(_ctx(1, 4096, 2048))[0].message  # Llama-3.1-8B's O shard at TP=2: rows of 2048
    assert "16 to 64 MiB" in check(_ctx(1, 1024, 4096))[0].message  # 8 MiB
    assert "at most 8" in check(_ctx(9, 2048, 4096))[0].message
    assert "multiple of 8 slices" in check(_ctx(1, 2048, 4096 + 512))[0].message
    for shape in ((1, 2048, 4096), (1, 2048, 8192), (1, 3072, 4096), (1, 4096, 4608), (1, 128256, 2048)):
        assert (check(_ctx(*shape)) == []) + (gemv(_ctx(*shape)) == []) <= 1
