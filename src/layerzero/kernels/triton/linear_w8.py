"""x @ W.T for an 8-bit weight (int8 or float8_e4m3fn) with block scales, dequantized in registers.

W[n, k] = weight[n, k] * scale[n // bn, k // bk]. Each K tile lies inside one scale block (BLOCK_K divides bk, or
bk covers all of K), so a tile's partial dot products are scaled once per output column: per-channel int8
(bn = 1, bk = K) and 128 x 128 FP8 blocks take the same kernels. The weight is read once, as 8 bits; that is
the whole win at decode, where a linear is bound by the bytes of its weight.

Two kernels, by row count (docs/quantization.md):
- up to GEMV_ROWS rows (decode): a GEMV, one program per BLOCK_N output columns, the rows' dot products summed
  in float32 from a [rows, BLOCK_N, BLOCK_K] product: many small programs keep every SM streaming weight bytes;
- more rows (batched decode, prefill): a tiled `tl.dot` GEMM, the weight tile converted to x's dtype (int8 and
  e4m3 values are exact in float16 / bfloat16), float32 accumulation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import dot_precision, interpreting, last_dim_contiguous, sm_count

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

GEMV_ROWS = 4


class TileConfig(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int = 2


@triton.jit
def _w8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, x_stride, s_stride, BN_S, BK_S,
                    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    s_rows = s_ptr + (rn // BN_S) * s_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + rm[:, None] * x_stride + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        part = tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
        acc += part * tl.load(s_rows + k0 // BK_S, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _w8_mm_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, x_stride, s_stride, BN_S, BK_S,
                  HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * x_stride
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * K  # the weight tile read as [BLOCK_K, BLOCK_N]
    s_rows = s_ptr + (rn // BN_S) * s_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        part = tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
        acc += part * tl.load(s_rows + k0 // BK_S, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def _k_tile(preferred: int, k: int, bk: int) -> int:
    """The K tile: `preferred`, shrunk to the scale block when a block is narrower (bk a power of two then)."""
    return preferred if bk >= k else min(preferred, bk)


def tile_config(m: int, n: int, k: int, bk: int, device: torch.device) -> TileConfig:
    """The launch shape for an [m, k] x [n, k]^T product (chosen on an H100, docs/quantization.md)."""
    if m <= GEMV_ROWS:
        # enough programs for two per SM: the weight stream needs every SM busy
        block_n = 16 if triton.cdiv(n, 16) >= 2 * sm_count(device) else 8
        return TileConfig(triton.next_power_of_2(m), block_n, _k_tile(256, k, bk), 4)
    if m <= 16:
        return TileConfig(16, 64, _k_tile(128, k, bk), 4, 3)
    if m <= 64:
        return TileConfig(64, 64, _k_tile(128, k, bk), 4, 3)
    return TileConfig(128, 128, _k_tile(64, k, bk), 8, 3)


def linear_w8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
              *, block_size: tuple[int, int], config: TileConfig | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N] in x's dtype; `config` overrides the launch shape (benchmarks)."""
    n, k = weight.shape
    bn, bk = block_size
    if not weight.is_contiguous() or not scale.is_contiguous():
        raise ValueError("linear_w8: the weight and its scales must be contiguous")
    x2 = last_dim_contiguous(x).reshape(-1, k)
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.view(*x.shape[:-1], n)
    cfg = config or tile_config(m, n, k, bk, x.device)
    b = bias if bias is not None else out
    common = (x2, weight, scale, b, out, m, n, k, x2.stride(0), scale.stride(0), bn, bk)
    if cfg.block_m < 16:  # the GEMV: every row in one tile (tl.dot needs 16)
        if cfg.block_m < m:
            raise ValueError(f"linear_w8: a GEMV tile of {cfg.block_m} rows cannot hold {m} rows")
        _w8_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
            *common, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            num_warps=cfg.warps, num_stages=cfg.stages)
    else:
        _w8_mm_kernel[(triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))](
            *common, HAS_BIAS=bias is not None, PRECISION=dot_precision(x.dtype), BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.warps, num_stages=cfg.stages)
    return out.view(*x.shape[:-1], n)
