"""x @ W.T for a 4-bit weight kept packed (two columns a byte, the even one in the low nibble) with a scale and a zero
per group of columns, W = (q - 8) * scale + zero, dequantized in registers.

This is the layout `lz.linear_int4` takes everywhere (GGUF's Q4_0 / Q4_1 / Q4_K become it at load, and so does
`quantization="int4"`), so a GGUF file keeps its 4-bit weights on the GPU as on the CPU. Two kernels, by row count
(docs/quantization.md):
- up to GEMV_ROWS rows (decode): a GEMV, one program per BLOCK_N output columns. Each byte gives an even and an odd
  column; x is read as its even and odd columns to match. A group's products sum before its scale, and the zero
  multiplies the group's sum of x, so scales and zeros are read once a group, not once a weight;
- more rows (batched decode, prefill): `tl.dot` tiles, each weight tile read as contiguous bytes, its nibbles put
  back in column order in registers, dequantized to x's dtype with its groups' scales and zeros, float32
  accumulation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision, interpreting, last_dim_contiguous

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

GEMV_ROWS = 4


class Int4Tiles(NamedTuple):
    """A launch shape: [block_m, block_n] output tiles over K tiles of `block_k` columns (block_k / 2 bytes a row)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int = 2


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, sz_ptr, b_ptr, out_ptr, M, N, K, x_stride, HAS_BIAS: tl.constexpr,
                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                      PDL: tl.constexpr):
    await_inputs(PDL)
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rb = tl.arange(0, HALF)
    rg = tl.arange(0, GROUPS)
    rows = tl.arange(0, ROWS)
    n_ok = rn < N
    q_rows = q_ptr + rn.to(tl.int64)[:, None] * (K // 2)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b = k0 // 2 + rb
        b_ok = b < K // 2
        byte = tl.load(q_rows + b[None, :], mask=n_ok[:, None] & b_ok[None, :], other=0)
        lo = (byte & 15).to(tl.float32) - 8.0
        hi = (byte >> 4).to(tl.float32) - 8.0
        g = k0 // GROUP + rg
        g_ok = n_ok[:, None] & (g < K // GROUP)[None, :]
        sz = sz_ptr + (g.to(tl.int64)[None, :] * N + rn[:, None]) * 2
        scale = tl.load(sz, mask=g_ok, other=0.0)  # [BLOCK_N, GROUPS]
        zero = tl.load(sz + 1, mask=g_ok, other=0.0)
        for m in tl.static_range(ROWS):
            x_row = x_ptr + m * x_stride + 2 * b
            xe = tl.load(x_row, mask=b_ok & (m < M), other=0.0).to(tl.float32)
            xo = tl.load(x_row + 1, mask=b_ok & (m < M), other=0.0).to(tl.float32)
            part = tl.sum(tl.reshape(lo * xe[None, :] + hi * xo[None, :], (BLOCK_N, GROUPS, GROUP // 2)), axis=2)
            x_sum = tl.sum(tl.reshape(xe + xo, (GROUPS, GROUP // 2)), axis=1)
            dot = tl.sum(scale * part + zero * x_sum[None, :], axis=1)
            acc += tl.where(rows[:, None] == m, dot[None, :], 0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows < M)[:, None] & n_ok[None, :])


_INT4_GEMV = Launcher(_int4_gemv_kernel)


@triton.jit
def _int4_mm_kernel(x_ptr, q_ptr, sz_ptr, b_ptr, out_ptr, M, N, K, x_stride, HAS_BIAS: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    # every load is contiguous along K (vectorized): x's tile, the bytes as [HALF, BLOCK_N], each group's scale and
    # zero; the nibbles are interleaved back into column order in registers and the tile dequantized to x's dtype
    HALF: tl.constexpr = BLOCK_K // 2
    TILE_GROUPS: tl.constexpr = BLOCK_K // GROUP if BLOCK_K > GROUP else 1
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rb = tl.arange(0, HALF)
    rg = tl.arange(0, TILE_GROUPS)
    n_ok = rn < N
    m_ok = rm < M
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * x_stride
    q_cols = q_ptr + rn.to(tl.int64)[None, :] * (K // 2)  # the weight tile read as [HALF, BLOCK_N] bytes
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        b = k0 // 2 + rb
        byte = tl.load(q_cols + b[:, None], mask=(b < K // 2)[:, None] & n_ok[None, :], other=0)
        q = tl.reshape(tl.permute(tl.join(byte & 15, byte >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N))
        g = k0 // GROUP + rg
        g_ok = (g < K // GROUP)[:, None] & n_ok[None, :]
        sz = sz_ptr + (g.to(tl.int64)[:, None] * N + rn[None, :]) * 2
        scale = tl.load(sz, mask=g_ok, other=0.0)  # [TILE_GROUPS, BLOCK_N]
        zero = tl.load(sz + 1, mask=g_ok, other=0.0)
        per_group: tl.constexpr = BLOCK_K // TILE_GROUPS
        scale = tl.reshape(tl.broadcast_to(scale[:, None, :], (TILE_GROUPS, per_group, BLOCK_N)), (BLOCK_K, BLOCK_N))
        zero = tl.reshape(tl.broadcast_to(zero[:, None, :], (TILE_GROUPS, per_group, BLOCK_N)), (BLOCK_K, BLOCK_N))
        w = (q.to(tl.float32) - 8.0) * scale + zero
        acc = tl.dot(x, w.to(x.dtype), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


_INT4_MM = Launcher(_int4_mm_kernel)


def tile_config(m: int, n: int, k: int, group: int) -> Int4Tiles:
    """The launch shape for an [m, k] x [n, k]^T product (chosen on an H100, docs/quantization.md)."""
    if m <= GEMV_ROWS:
        # a GEMV tile holds whole groups; 1 KB of each weight row a load keeps the weight streaming, 8 rows a
        # program for the long matmuls
        return Int4Tiles(triton.next_power_of_2(m), 8 if n * k >= 2**25 else 4,
                         max(group, min(2048, triton.next_power_of_2(k))), 4)
    if m > 64:  # prefill: compute-bound; 128-column tiles from 4096 output features (fewer, fuller waves)
        return Int4Tiles(128, 128 if n >= 4096 else 64, 64, 4, 3)
    # batched decode: the widest matmuls take 64 x 64 tiles; others 32 columns over longer K tiles, and 16 rows
    # when the outputs are few (enough programs for the SMs)
    block_m = 16 if m <= 16 or n <= 2048 else 32 if m <= 32 else 64
    if n >= 16384:
        return Int4Tiles(block_m, 64, 64, 4, 3)
    return Int4Tiles(block_m, 32, 128, 4, 4)


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int, config: Int4Tiles | None = None) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N] in x's dtype; `config` overrides the launch shape (benchmarks)."""
    n, k = qweight.shape[0], 2 * qweight.shape[1]
    if not qweight.is_contiguous() or not scales_zeros.is_contiguous() or scales_zeros.dtype != torch.float32:
        raise ValueError("linear_int4: qweight and float32 scales_zeros must be contiguous")
    x2 = last_dim_contiguous(x).reshape(-1, k)
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out.view(*x.shape[:-1], n)
    cfg = config or tile_config(m, n, k, group_size)
    b = bias if bias is not None else out
    if cfg.block_m < 16:  # the GEMV: every row in one tile (tl.dot needs 16)
        if cfg.block_m < m or cfg.block_k % group_size:
            raise ValueError(f"linear_int4: a GEMV tile of {cfg.block_m} rows x {cfg.block_k} columns cannot take "
                             f"{m} rows in groups of {group_size}")
        _INT4_GEMV((triton.cdiv(n, cfg.block_n),),
            x2, qweight, scales_zeros, b, out, m, n, k, x2.stride(0), HAS_BIAS=bias is not None, ROWS=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP=group_size, num_warps=cfg.warps, num_stages=cfg.stages)
    else:
        if max(group_size, cfg.block_k) % min(group_size, cfg.block_k):
            raise ValueError(f"linear_int4: K tiles of {cfg.block_k} columns and groups of {group_size} must nest")
        _INT4_MM((triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)),
            x2, qweight, scales_zeros, b, out, m, n, k, x2.stride(0), HAS_BIAS=bias is not None,
            PRECISION=dot_precision(x.dtype), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            GROUP=group_size, num_warps=cfg.warps, num_stages=cfg.stages)
    return out.view(*x.shape[:-1], n)
