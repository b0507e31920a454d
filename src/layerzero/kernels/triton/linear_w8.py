"""x @ W.T for an 8-bit weight (int8 or float8_e4m3fn) with block scales, dequantized in registers.

W[n, k] = weight[n, k] * scale[n // bn, k // bk]: per-channel int8 (bn = 1, bk = K) and 128 x 128 FP8 blocks take
the same kernels. The weight is read once, as 8 bits; that is the whole win at decode, where a linear is bound by
the bytes of its weight.

Two kernels, by row count (docs/quantization.md):
- up to GEMV_ROWS rows (decode): a GEMV, one program per 4 output columns reading 2048 columns per load, the
  rows' dot products summed in float32; the scales go where they cost least (SCALE_* below);
- more rows (batched decode, prefill): a tiled `tl.dot` GEMM, the weight tile converted to x's dtype (int8 and
  e4m3 values are exact in float16 / bfloat16), float32 accumulation; each K tile lies inside one scale block
  (BLOCK_K divides bk, or bk covers all of K), so a tile's partial products are scaled once per output column.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import (
    Launcher,
    await_inputs,
    dot_precision,
    interpreting,
    last_dim_contiguous,
    sm_count,
)

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

GEMV_ROWS = 4


class TileConfig(NamedTuple):
    """A launch shape: a [block_m, block_n] output tile over K tiles of `block_k` (the GEMV takes every row);
    tl.dot tiles may split K over `split` programs whose float32 partials are summed after."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int = 2
    split: int = 1


# How the GEMV applies scales (a constexpr): per output row after the row's sum (scales span K); to x, when a
# program's rows share one row block (FP8 checkpoints' 128-row blocks); to each weight (anything else).
SCALE_ROW, SCALE_X, SCALE_WEIGHT = 0, 1, 2


@triton.jit
def _w8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, x_stride, s_stride, BN_S, BK_S,
                    HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SCALES: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rows = tl.arange(0, ROWS)
    n_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * K
    s_rows = s_ptr + (rn // BN_S) * s_stride
    s_first = s_ptr + (tl.program_id(0) * BLOCK_N // BN_S) * s_stride  # SCALE_X: the program's one row block
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        w = tl.load(w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        if SCALES == 2:
            w = w * tl.load(s_rows[:, None] + k[None, :] // BK_S, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        for m in tl.static_range(ROWS):
            x = tl.load(x_ptr + m * x_stride + k, mask=k_ok & (m < M), other=0.0).to(tl.float32)
            if SCALES == 1:
                x = x * tl.load(s_first + k // BK_S, mask=k_ok, other=0.0)
            dot = tl.sum(w * x[None, :], axis=1)
            acc += tl.where(rows[:, None] == m, dot[None, :], 0.0)
    if SCALES == 0:
        acc = acc * tl.load(s_rows, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows < M)[:, None] & n_ok[None, :])


_W8_GEMV = Launcher(_w8_gemv_kernel)


@triton.jit
def _w8_mm_kernel(x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, M, N, K, x_stride, s_stride, BN_S, BK_S, K_PER,
                  HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    # program (.., .., s) sums K columns [s * K_PER, (s + 1) * K_PER) into out[s]: split K gives float32 partials
    pid_k = tl.program_id(2)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    m_ok = rm < M
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * x_stride
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * K  # the weight tile read as [BLOCK_K, BLOCK_N]
    s_rows = s_ptr + (rn // BN_S) * s_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(pid_k * K_PER, tl.minimum(pid_k * K_PER + K_PER, K), BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        part = tl.dot(x, w.to(x.dtype), input_precision=PRECISION)
        acc += part * tl.load(s_rows + k0 // BK_S, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_tile = out_ptr + pid_k.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(out_tile, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


_W8_MM = Launcher(_w8_mm_kernel)


def _k_tile(preferred: int, k: int, bk: int) -> int:
    """The tl.dot K tile: `preferred`, shrunk to the scale block when a block is narrower (bk a power of two then)."""
    return preferred if bk >= k else min(preferred, bk)


def tile_config(m: int, n: int, k: int, bk: int, sms: int) -> TileConfig:
    """The launch shape for an [m, k] x [n, k]^T product (chosen on an H100, docs/quantization.md)."""
    if m <= GEMV_ROWS:
        # 4 rows x 2048 columns of 8-bit weight per load: wide loads keep enough bytes in flight to stream the
        # weight near the copy bandwidth (narrower tiles measured 1.5-3x slower at 1 row); few long rows take
        # twice that with 8 warps
        if n <= 2048 and k >= 8192:
            return TileConfig(triton.next_power_of_2(m), 4, 4096, 8)
        return TileConfig(triton.next_power_of_2(m), 4, min(2048, triton.next_power_of_2(k)), 4)
    if m > 64:  # prefill: compute-bound, the largest tiles
        return TileConfig(128, 128, _k_tile(64, k, bk), 8, 3)
    # batched decode (from the H100 sweep): the widest matmuls take wide N tiles; a long K splits over 4 programs
    # (one SM streaming a long K alone is latency-bound); short ones take narrow N tiles for enough programs
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    if n >= 8 * 1024:
        return TileConfig(block_m, 128 if k >= 4096 else 64, _k_tile(128, k, bk), 4, 3)
    if k >= 4096:
        tiles = triton.cdiv(n, 64) * triton.cdiv(m, block_m)
        return TileConfig(block_m, 64, _k_tile(128, k, bk), 4, 4, max(1, min(4, triton.cdiv(2 * sms, tiles))))
    return TileConfig(block_m, 32, _k_tile(128, k, bk), 4, 4)


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
    cfg = config or tile_config(m, n, k, bk, sm_count(x.device))
    b = bias if bias is not None else out
    if cfg.block_m < 16:  # the GEMV: every row in one tile (tl.dot needs 16)
        if cfg.block_m < m:
            raise ValueError(f"linear_w8: a GEMV tile of {cfg.block_m} rows cannot hold {m} rows")
        scales = SCALE_ROW if bk >= k else SCALE_X if bn % cfg.block_n == 0 else SCALE_WEIGHT
        _W8_GEMV((triton.cdiv(n, cfg.block_n),),
            x2, weight, scale, b, out, m, n, k, x2.stride(0), scale.stride(0), bn, bk, HAS_BIAS=bias is not None,
            ROWS=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SCALES=scales, num_warps=cfg.warps,
            num_stages=cfg.stages)
        return out.view(*x.shape[:-1], n)
    # K_PER: whole K tiles, so a split never cuts through a tile (nor a tile through a scale block)
    k_per = triton.cdiv(triton.cdiv(k, cfg.split), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_per)
    dest = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    _W8_MM((triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m), split),
        x2, weight, scale, b, dest, m, n, k, x2.stride(0), scale.stride(0), bn, bk, k_per,
        HAS_BIAS=bias is not None, PRECISION=dot_precision(x.dtype), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, num_warps=cfg.warps, num_stages=cfg.stages)
    if split > 1:
        out.copy_(dest.sum(dim=0))  # float32 partials summed in a fixed order, rounded once
    return out.view(*x.shape[:-1], n)
