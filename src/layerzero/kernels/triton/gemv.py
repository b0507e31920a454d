"""Skinny linear in Triton: y [M, N] = x [M, K] @ W [N, K]^T (+ bias) for decode's few rows, one pass over W.

Grid (N / BLOCK_N, M / 16): a program streams BLOCK_N rows of the weight over all of K in BLOCK_K steps and
multiplies them with the (at most 16, zero-padded) rows of x on the tensor cores, float32 accumulation. At batch
1-8 the weight read is the whole cost; on the projections larger than the H100's 50 MB L2 this reads them 4-9%
faster than cuBLAS (benchmarks/reports/gemv_bandwidth_h100.md), which is where the spec lets it run.

The gated form (`gated_linear_gemv`, a gated MLP's gate+up projection with its activation) streams gate row j and
up row I + j in the same program and writes act(gate) * up: the activation's kernel, and the [M, 2I] round trip
between the two, are gone from a decode step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.reference.activation import GATED_ACTIVATIONS
from layerzero.kernels.triton.activation import gated_product
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


@triton.jit
def _gated_gemv_kernel(x_ptr, w_ptr, y_ptr, M, I, K, x_sm, w_sn, y_sm, ACT: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < I
    gate_rows = w_ptr + cols[None, :].to(tl.int64) * w_sn
    up_rows = gate_rows + I * w_sn
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * x_sm + k[None, :], mask=r_mask[:, None] & k_mask[None, :],
                    other=0.0)
        w_mask = c_mask[None, :] & k_mask[:, None]
        acc_g = tl.dot(x, tl.load(gate_rows + k[:, None], mask=w_mask, other=0.0), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, tl.load(up_rows + k[:, None], mask=w_mask, other=0.0), acc_u, input_precision=PRECISION)
    # rounded to the output dtype first, as the unfused projection's output is before its activation
    dtype = y_ptr.dtype.element_ty
    y = gated_product(acc_g.to(dtype).to(tl.float32), acc_u.to(dtype).to(tl.float32), ACT)
    tl.store(y_ptr + rows[:, None].to(tl.int64) * y_sm + cols[None, :], y.to(dtype),
             mask=r_mask[:, None] & c_mask[None, :])


_GATED_GEMV = Launcher(_gated_gemv_kernel)


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


def gated_linear_gemv(x: torch.Tensor, weight: torch.Tensor, *, activation: str) -> torch.Tensor:
    """act(x @ weight[:I]^T) * (x @ weight[I:]^T) -> [..., I] in x.dtype, for weight [2I, K] (gate rows, then up)."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GATED_ACTIVATIONS}, got {activation!r}")
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k or weight.shape[0] % 2:
        raise ValueError(f"gated_linear: x [..., {k}] and weight {tuple(weight.shape)} do not fit (weight [2I, {k}])")
    inner = weight.shape[0] // 2
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, inner), dtype=x.dtype, device=x.device)
    if m == 0 or inner == 0:
        return y.view(*x.shape[:-1], inner)
    # the fastest of 108 tiles on the Llama-3.2-1B and 3.1-8B gate+up weights (gemv_bandwidth.py --gated, H100);
    # 16 columns (the plain GEMV's bytes per step) read the 8B one 16% slower
    block_k = 128 if k <= 2048 else 256
    _GATED_GEMV((triton.cdiv(inner, 32), triton.cdiv(m, ROWS)), x2, weight, y, m, inner, k, x2.stride(0),
                weight.stride(0), y.stride(0), ACT=activation, BLOCK_M=ROWS, BLOCK_N=32, BLOCK_K=block_k,
                PRECISION=dot_precision(x.dtype), num_warps=4, num_stages=3)
    return y.view(*x.shape[:-1], inner)
