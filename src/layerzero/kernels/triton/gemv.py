"""Skinny linear in Triton: y [M, N] = x [M, K] @ W [N, K]^T (+ bias) for decode's few rows, one pass over W.

`linear_gemv`, grid (N / BLOCK_N, M / 16): a program streams BLOCK_N rows of the weight over all of K in BLOCK_K
steps and multiplies them with the (at most 16, zero-padded) rows of x on the tensor cores, float32 accumulation.
At batch 1-8 the weight read is the whole cost; on the projections larger than the H100's 50 MB L2 this reads them
4-9% faster than cuBLAS (benchmarks/reports/gemv_bandwidth_h100.md), which is where the spec lets it run.

`linear_splitk` for long rows and few outputs (Qwen3-30B-A3B's O projection: 2048 outputs of 4096 columns), where
column blocks alone would leave SMs idle: the programs also split K in SPLITS slices, each writes float32 partial
sums, and a second kernel adds the slices in order (the same bits whatever ran first) and rounds them to x's dtype.
Both kernels are PDL dependents, so the split costs a kernel boundary PDL mostly hides, not a counter and its
fence: in a chain of layers it beat cuBLAS's split-K and its reduce kernel by 1.3 µs a layer on an H200
(benchmarks/reports/splitk_chain_h200.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision, interpreting
from layerzero.kernels.triton.specs import SPLITK_BLOCK_K, SPLITK_SLICES

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

ROWS = 16  # x rows per program: tl.dot's smallest M


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, x_sm, w_sn, y_sm, HAS_BIAS: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                 PDL: tl.constexpr):
    await_inputs(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_sm + k[None, :], mask=r_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :] & k_mask[:, None],
                    other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=c_mask, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None].to(tl.int64) * y_sm + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=r_mask[:, None] & c_mask[None, :])


_GEMV = Launcher(_gemv_kernel)


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, p_ptr, M, N, K, x_sm, w_sn, SLICE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    """partials[s] [M, N] float32: x's columns of slice s times the weight's."""
    await_inputs(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(split * SLICE, split * SLICE + SLICE, BLOCK_K):  # SLICE is a multiple of BLOCK_K
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_sm + k[None, :], mask=r_mask[:, None], other=0.0)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * w_sn + k[:, None], mask=c_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION)
    tl.store(p_ptr + (split * M + rows[:, None]).to(tl.int64) * N + cols[None, :], acc,
             mask=r_mask[:, None] & c_mask[None, :])


@triton.jit
def summed_slices(p_ptr, offsets, mask, slice_stride, SPLITS: tl.constexpr):
    """The float32 sum of SPLITS partial slices at `offsets` (slice s at p_ptr + s * slice_stride), in slice order:
    the same bits in every kernel that sums them (the sum kernel below, or a consumer that reads the partials)."""
    y = tl.load(p_ptr + offsets, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLITS):
        y += tl.load(p_ptr + s * slice_stride + offsets, mask=mask, other=0.0)
    return y


@triton.jit
def projected_at(p_ptr, offsets, mask, slice_stride, SLICES: tl.constexpr, dtype: tl.constexpr):
    """A projection's output at `offsets`, for a kernel that reads it: as stored (SLICES 0), or its SLICES split-K
    partials summed and rounded to `dtype`, as the sum kernel would have written them."""
    if SLICES > 0:
        rows = summed_slices(p_ptr, offsets, mask, slice_stride, SLICES).to(dtype)
    else:
        rows = tl.load(p_ptr + offsets, mask=mask, other=0.0)
    return rows


@triton.jit
def _sum_slices_kernel(p_ptr, b_ptr, y_ptr, MN, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    """y [M, N] = the slices' partials summed in slice order (+ bias), in y's dtype."""
    await_inputs(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < MN
    y = summed_slices(p_ptr, i, mask, MN, SPLITS)
    if HAS_BIAS:
        y += tl.load(b_ptr + i % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + i, y.to(y_ptr.dtype.element_ty), mask=mask)


_SPLITK = Launcher(_splitk_kernel)
_SUM_SLICES = Launcher(_sum_slices_kernel)
# (SPLITS, BLOCK_N, BLOCK_K): the best of 27 tilings with the sum in a kernel of its own on Qwen3-30B-A3B's O
# projection in a chain of layers (benchmarks/splitk_chain.py): 256 programs for its 2048 outputs
SPLITK_TILE = (SPLITK_SLICES, 64, SPLITK_BLOCK_K)
SUM_BLOCK = 512


def _check_shapes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, int]:
    k = x.shape[-1]
    n = weight.shape[0]
    if weight.shape[1] != k or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"linear: x [..., {k}], weight {tuple(weight.shape)} and bias "
                         f"{None if bias is None else tuple(bias.shape)} do not fit")
    return k, n


def _rows(x: torch.Tensor, weight: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x as [M, K] and the weight, both unit-stride along K."""
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, weight if weight.stride(-1) == 1 else weight.contiguous()


def linear_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N] in x.dtype."""
    k, n = _check_shapes(x, weight, bias)
    x2, weight = _rows(x, weight, k)
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y.view(*x.shape[:-1], n)
    block_n = 64 if n >= 65536 else 32
    block_k = 128 if k <= 4096 else 256
    _GEMV((triton.cdiv(n, block_n), triton.cdiv(m, ROWS)), x2, weight, weight if bias is None else bias, y, m, n, k,
          x2.stride(0), weight.stride(0), y.stride(0), HAS_BIAS=bias is not None, BLOCK_M=ROWS, BLOCK_N=block_n,
          BLOCK_K=block_k, PRECISION=dot_precision(x.dtype), num_warps=4, num_stages=4 if block_k == 256 else 3)
    return y.view(*x.shape[:-1], n)


def _splitk_launch(steps: int, block_n: int) -> dict[str, int]:
    """The split-K GEMV's warps and pipeline stages for slices of `steps` BLOCK_K tiles: in 32-column blocks (the
    folds' tile) a slice of 8 or more (the O projection of Qwen3-30B-A3B, 4096 columns in 4 slices) keeps four
    tiles in flight on two warps, 6.5 against 7.2 µs a call; shorter slices (its QKV's 4 tiles) and wider blocks
    keep 3 stages on 4 warps (7.2 against 7.4-8.0 for the QKV; benchmarks/reports/splitk_norm_variants_h200.md)."""
    return dict(num_warps=2, num_stages=4) if steps >= 8 and block_n <= 32 else dict(num_warps=4, num_stages=3)


def splitk_partials(x: torch.Tensor, weight: torch.Tensor, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """float32 partials [SPLITS, M, N] of x [M, K] @ weight [N, K]^T, K cut in SPLITS slices (`tile`: (SPLITS,
    BLOCK_N, BLOCK_K), SPLITK_TILE by default), for at most ROWS rows: summed in slice order (`summed_slices`) by
    the sum kernel of `linear_splitk`, or by a fused op's kernel that reads the projection's output."""
    k, n = _check_shapes(x, weight, None)
    splits, block_n, block_k = tile or SPLITK_TILE
    if k % (splits * block_k):
        raise ValueError(f"split-K GEMV: K = {k} is not a multiple of {splits} x {block_k}")
    x2, weight = _rows(x, weight, k)
    m = x2.shape[0]
    if m > ROWS:
        raise ValueError(f"the split-K GEMV takes at most {ROWS} rows, got {m}")
    partials = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    if m and n:
        _SPLITK((triton.cdiv(n, block_n), splits), x2, weight, partials, m, n, k, x2.stride(0), weight.stride(0),
                SLICE=k // splits, BLOCK_M=ROWS, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(x.dtype),
                **_splitk_launch(k // splits // block_k, block_n))
    return partials


def linear_splitk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N] in x.dtype for at most 16 rows, K split into
    SPLITK_SLICES slices (a multiple of SPLITK_SLICES x SPLITK_BLOCK_K)."""
    k, n = _check_shapes(x, weight, bias)
    partials = splitk_partials(x.reshape(-1, k), weight)
    splits, m = partials.shape[0], partials.shape[1]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        _SUM_SLICES((triton.cdiv(m * n, SUM_BLOCK),), partials, weight if bias is None else bias, y, m * n, n,
                    SPLITS=splits, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK, num_warps=4)
    return y.view(*x.shape[:-1], n)
