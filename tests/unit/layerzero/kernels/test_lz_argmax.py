"""argmax: the chunked reference and the interpreted Triton kernel against torch.argmax on fresh random inputs (ties,
-inf rows, sparse rows, NaN, strided rows), the Triton spec's rules for a CUDA call, and `lz.argmax` on the CPU."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference import argmax as ref
from layerzero.kernels.triton import specs
from layerzero.select import reasons as R
from layerzero.select.constraints import check
from layerzero.select.context import SelectionContext

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
INF = float("inf")
NAN = float("nan")


def _logits(rng: torch.Generator, rows: int, vocab: int, dtype: torch.dtype, block: int) -> torch.Tensor:
    """[rows, vocab] logits, a strided slice of a wider tensor, whose rows cover the cases: random, a tie across
    blocks, a tie inside one block, all -inf, a few finite values among -inf (a structured-output mask), a tie of
    two finite values among -inf, all negative."""
    wide = torch.randn(rows, vocab + 5, generator=rng).to(dtype)
    x = wide[:, 3 : 3 + vocab]

    def pos(lo: int, hi: int) -> int:
        return int(torch.randint(lo, max(hi, lo + 1), (1,), generator=rng))

    cases = rows
    if cases > 1 and vocab > 1:  # the same maximum in two blocks (or twice in the one block)
        a = pos(0, min(block, vocab) - 1)
        b = pos(block, vocab) if vocab > block else pos(a + 1, vocab)
        x[1, a] = x[1, b] = 50.0
    if cases > 2 and vocab > 1:  # twice in one block, past the first block when there is one
        start = block * pos(0, (vocab - 1) // block + 1) if vocab > block else 0
        end = min(start + block, vocab)
        a = pos(start, end - 1)
        x[2, a] = x[2, pos(a + 1, end)] = 50.0
    if cases > 3:
        x[3] = -INF
    if cases > 4:
        x[4] = -INF
        for _ in range(3):
            x[4, pos(0, vocab)] = float(torch.randn(1, generator=rng))
    if cases > 5 and vocab > 1:
        x[5] = -INF
        a = pos(0, vocab - 1)
        x[5, a] = x[5, pos(a + 1, vocab)] = -7.0
    if cases > 6:
        x[6] = -x[6].abs() - 1
    return x


@pytest.fixture
def small_blocks(triton_interpreted, monkeypatch):
    """The interpreted kernel with 256-id blocks: 128256's many-block structure at a test's size."""
    module = triton_interpreted("argmax")
    monkeypatch.setattr(module, "BLOCK", 256)
    monkeypatch.setattr(module, "MIN_BLOCK", 256)
    return module


# 4008 = 128256 / 32 (its last block partial, as 128256's is at 4096), 1024 divisible by the block, 1000 not,
# 100 and 1 under one block
VOCABS = [4008, 1024, 1000, 100, 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_reference_equals_torch_argmax(rng, dtype, vocab):
    x = _logits(rng, 8, vocab, dtype, block=vocab // max(ref.argmax_chunks(vocab), 1))
    assert not x.is_contiguous()
    got = ref.argmax(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=-1)), f"seed {rng.initial_seed()}"
    assert torch.equal(ref.argmax(x.contiguous()), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_triton_equals_torch_argmax(small_blocks, rng, dtype, vocab):
    x = _logits(rng, 8, vocab, dtype, block=256)
    got = small_blocks.argmax(x)
    assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=-1)), f"seed {rng.initial_seed()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_at_its_own_block_size(triton_interpreted, rng, dtype):
    """4096-id blocks: 9000 ids in three, the last partial; a row slice two rows apart."""
    x = _logits(rng, 14, 9000, dtype, block=4096)[::2]
    assert torch.equal(triton_interpreted("argmax").argmax(x), x.argmax(dim=-1)), f"seed {rng.initial_seed()}"


def _nan_rows(dtype: torch.dtype) -> torch.Tensor:
    x = torch.zeros(5, 1000)
    x[0, [10, 700]] = NAN  # two NaNs in different blocks: the first wins
    x[1, 3], x[1, 600] = INF, NAN  # a NaN after +inf still wins
    x[2, 900], x[2, 950] = NAN, NAN  # both in the last block
    x[3] = -INF
    x[3, 555] = NAN
    x[4, 0] = NAN
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_first_nan_wins_as_in_torch(small_blocks, dtype):
    x = _nan_rows(dtype)
    want = torch.tensor([10, 600, 900, 555, 0])
    assert torch.equal(x.argmax(dim=-1), want)
    assert torch.equal(ref.argmax(x), want)
    assert torch.equal(small_blocks.argmax(x), want)


def test_empty_rows_and_bad_shapes(small_blocks):
    for fn in (ref.argmax, small_blocks.argmax):
        assert fn(torch.randn(0, 300)).shape == (0,)
        for bad in (torch.randn(5), torch.randn(2, 3, 4), torch.randn(3, 0)):
            with pytest.raises(ValueError, match="rows, V"):
                fn(bad)
    with pytest.raises(ValueError, match="contiguous"):
        small_blocks.argmax(torch.randn(300, 4).t())


def test_block_size_gives_few_rows_more_programs(triton_interpreted):
    module = triton_interpreted("argmax")
    assert module.block_size(256, 128256, 132) == 4096  # decode at batch 256: 8192 programs
    assert module.block_size(1, 128256, 132) == 1024  # one row: 126 programs rather than 32
    assert module.block_size(1, 100, 132) == 128  # one block, a power of two


def _spec():
    return next(s for s in specs.kernel_specs() if s.op == "argmax")


def _cuda(x: torch.Tensor) -> SelectionContext:
    """The context of lz.argmax(x) had x been on an SM90 GPU."""
    return SelectionContext.from_tensors("argmax", x).with_(device="cuda:0", platform="cuda", sm=90)


def test_triton_spec_takes_2d_float_cuda_rows(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = _spec()
    assert spec.kernel_id == "triton.argmax" and spec.graph_safe and spec.requires_last_dim_contiguous
    assert spec.priority > 10  # above the reference
    for dtype in DTYPES:
        wide = torch.randn(4, 140, dtype=dtype)
        assert check(spec, _cuda(wide[:, :128]), strict=False, deterministic=False)[0] == []

    def codes(x: torch.Tensor, ctx: SelectionContext | None = None) -> list[str]:
        return [r.code for r in check(spec, ctx or _cuda(x), strict=False, deterministic=False)[0]]

    x = torch.randn(4, 128)
    assert codes(x, SelectionContext.from_tensors("argmax", x)) == [R.PLATFORM_MISMATCH]
    assert codes(x.double()) == [R.DTYPE_UNSUPPORTED]
    assert codes(torch.randn(128, 4).t()) == [R.STRIDE_LAST_DIM]
    reasons = check(spec, _cuda(torch.randn(2, 4, 128)), strict=False, deterministic=False)[0]
    assert [r.code for r in reasons] == [R.CONSTRAINT_FAILED] and "2-D" in reasons[0].message


def test_lz_argmax_on_the_cpu(rng):
    x = _logits(rng, 7, 1000, torch.float32, block=200)
    assert torch.equal(lz.argmax(x), x.argmax(dim=-1))
    assert lz.which("argmax", x)["kernel_id"] == "reference.argmax"
    report = lz.explain("argmax", x)
    triton = next(c for c in report.candidates if c.kernel_id == "triton.argmax")
    assert triton.valid or all(r.code in (R.PLATFORM_MISMATCH, R.NOT_INSTALLED) for r in triton.reasons)
    site = lz.bind("argmax")
    assert torch.equal(site(x), x.argmax(dim=-1)) and torch.equal(site(x), x.argmax(dim=-1))
    with pytest.raises(ValueError, match="rows, V"):
        lz.argmax(torch.randn(2, 3, 4))
