"""Skinny linear in Triton: y [M, N] = x [M, K] @ W [N, K]^T (+ bias) for decode's few rows, one pass over W.

Grid (N / BLOCK_N, M / 16): a program streams BLOCK_N rows of the weight over all of K in BLOCK_K steps and
multiplies them with the (at most 16, zero-padded) rows of x on the tensor cores, float32 accumulation. At batch
1-8 the weight read is the whole cost; on the projections larger than the H100's 50 MB L2 this reads them 4-9%
faster than cuBLAS (benchmarks/reports/gemv_bandwidth_h100.md), which is where the spec lets it run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision, interpreting

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


def linear_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N] in x.dtype."""
    k = x.shape[-1]
    n = weight.shape[0]
    if weight.shape[1] != k or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"linear: x [..., {k}], weight {tuple(weight.shape)} and bias "
                         f"{None if bias is None else tuple(bias.shape)} do not fit")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
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
