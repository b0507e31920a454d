"""A mixture of experts' MLPs in Triton, two ways.

`fused_moe` (batches): the (token, expert) pairs sorted by expert and padded to the GEMM's row block, then one grouped
GEMM for gate and up with the activation in its epilogue, and one for down with the routing weight in its epilogue;
the pairs summed back per token.

Graph-safe: the sort and the padding are device ops (no host sync), and every buffer and grid is sized from the
shapes for the worst case (each expert's group padded by at most BLOCK_M - 1 rows: T * k + E * (BLOCK_M - 1) rows);
blocks past the used ones exit at once. Each row block holds one expert's pairs, so it reads that expert's weights
once: a decode step reads only the routed experts' weights, a large batch every expert's once.

The decode path for a few tokens, with no sort, is moe_decode.py; it shares this module's activation and 8-bit
scale helpers.

`fused_moe_w8` (and moe_decode.py's `fused_moe_w8_decode`) are the same two paths over experts kept 8-bit (an FP8
checkpoint's e4m3 experts, a GGUF's Q8_0 ones), so the routed experts stream in 8 bits (`SCALED`). The GEMMs keep a K
tile inside one scale block (BLOCK_K divides the block's columns): the tile's scales are one per weight row, loaded
once per tile, and multiply its partial products (tl.dot of the widened tile, then scaled per output column). The
decode path's tiles may span several blocks: each row's scales are loaded once per block and broadcast over its
columns, and they multiply the activations the tile meets. A first version gathered a scale for every weight
element: batch 16 ran at 156 tok/s on the 30B shape, a tenth of the float path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, dot_precision, interpreting, next_pow2

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

BLOCK_M = 16  # rows of a block: tl.dot's smallest; decode's one pair per expert wastes rows, not bytes
BLOCK_K = 64


@triton.jit
def activate(g, ACT: tl.constexpr):
    # silu(g) = g * sigmoid(g); gelu_tanh(g) = g * sigmoid(2z), z = sqrt(2/pi) (g + 0.044715 g^3); exp of -|arg| only
    arg = g if ACT == "silu" else 1.5957691216057308 * (g + 0.044715 * g * g * g)
    e = tl.exp(-tl.abs(arg))
    return g * tl.where(arg >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _row_scales(s_ptr, expert, rows, rows_ok, k0, S_ROWS, S_COLS, BN: tl.constexpr, BK: tl.constexpr):
    """The scales of weight rows `rows` of `expert` in the K tile starting at k0 (inside one scale block)."""
    return tl.load(s_ptr + expert * S_ROWS * S_COLS + (rows // BN) * S_COLS + k0 // BK, mask=rows_ok, other=0.0)


@triton.jit
def tile_scales(s_ptr, expert, rows, rows_ok, k0, S_ROWS, S_COLS, BN: tl.constexpr, BK: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """[ROWS, BLOCK_K]: each element's scale in the K tile starting at k0, for a tile spanning BLOCK_K // BK scale
    blocks (one scale load per row and block, broadcast over the block's columns)."""
    SUB: tl.constexpr = BLOCK_K // BK if BLOCK_K > BK else 1
    block = k0 // BK + tl.arange(0, SUB)
    s = tl.load(s_ptr + expert * S_ROWS * S_COLS + (rows // BN)[:, None] * S_COLS + block[None, :],
                mask=rows_ok[:, None] & (block < S_COLS)[None, :], other=0.0)
    return tl.reshape(tl.broadcast_to(s[:, :, None], (ROWS, SUB, BLOCK_K // SUB)), (ROWS, BLOCK_K))


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, s_ptr, h_ptr, pairs_ptr, block_expert_ptr, num_pairs, inner, hidden, num_experts,
                    S_ROWS, S_COLS, K: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr, PDL: tl.constexpr):
    """h[row] = act(x[token] @ gate_e.T) * (x[token] @ up_e.T) for a block of one expert's pair rows."""
    await_inputs(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert >= num_experts:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + rows)
    valid = pair < num_pairs
    token = tl.where(valid, pair // K, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inner
    w_expert = w_ptr + expert * 2 * inner * hidden
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(x_ptr + token[:, None] * hidden + ks[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
        w_ok = col_ok[None, :] & k_ok[:, None]
        wg = tl.load(w_expert + cols[None, :].to(tl.int64) * hidden + ks[:, None], mask=w_ok, other=0.0)
        wu = tl.load(w_expert + (inner + cols[None, :]).to(tl.int64) * hidden + ks[:, None], mask=w_ok, other=0.0)
        if SCALED:
            sg = _row_scales(s_ptr, expert, cols, col_ok, k0, S_ROWS, S_COLS, BN, BK)
            su = _row_scales(s_ptr, expert, inner + cols, col_ok, k0, S_ROWS, S_COLS, BN, BK)
            gate += tl.dot(a, wg.to(a.dtype), input_precision=PRECISION) * sg[None, :]
            up += tl.dot(a, wu.to(a.dtype), input_precision=PRECISION) * su[None, :]
        else:
            gate = tl.dot(a, wg, gate, input_precision=PRECISION)
            up = tl.dot(a, wu, up, input_precision=PRECISION)
    h = activate(gate, ACT) * up
    tl.store(h_ptr + rows[:, None].to(tl.int64) * inner + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, s_ptr, out_ptr, pairs_ptr, block_expert_ptr, weights_ptr, num_pairs, inner, hidden,
                 num_experts, S_ROWS, S_COLS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 PRECISION: tl.constexpr, SCALED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 PDL: tl.constexpr):
    """out[pair] = weight[pair] * (h[row] @ down_e.T) for a block of one expert's pair rows."""
    await_inputs(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert >= num_experts:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + rows)
    valid = pair < num_pairs
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    w_expert = w_ptr + expert * hidden * inner
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inner, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inner
        a = tl.load(h_ptr + rows[:, None].to(tl.int64) * inner + ks[None, :], mask=valid[:, None] & k_ok[None, :],
                    other=0.0)
        w_ok = col_ok[None, :] & k_ok[:, None]
        w = tl.load(w_expert + cols[None, :].to(tl.int64) * inner + ks[:, None], mask=w_ok, other=0.0)
        if SCALED:
            sw = _row_scales(s_ptr, expert, cols, col_ok, k0, S_ROWS, S_COLS, BN, BK)
            acc += tl.dot(a, w.to(a.dtype), input_precision=PRECISION) * sw[None, :]
        else:
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
    weight = tl.load(weights_ptr + tl.where(valid, pair, 0), mask=valid, other=0.0).to(tl.float32)
    out_rows = tl.where(valid, pair, 0).to(tl.int64)
    tl.store(out_ptr + out_rows[:, None] * hidden + cols[None, :], acc * weight[:, None],
             mask=valid[:, None] & col_ok[None, :])


_GATE_UP = Launcher(_gate_up_kernel)
_DOWN = Launcher(_down_kernel)


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair index per padded row, expert per row block): the T * k (token, slot) pairs grouped by expert, each group
    padded to a multiple of block_m rows with the sentinel T * k; blocks past the last group get expert E. Sizes are
    the worst case of the shapes, every op is on the device."""
    flat = ids.reshape(-1)
    pairs = flat.numel()
    max_rows = pairs + num_experts * (block_m - 1)
    max_blocks = triton.cdiv(max_rows, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    group_start = torch.cumsum(padded, 0) - padded  # each expert's first padded row
    order = torch.argsort(flat, stable=True)  # pairs by expert
    first_of_expert = torch.cumsum(counts, 0) - counts
    sorted_expert = flat[order]
    position = group_start[sorted_expert] + torch.arange(pairs, device=ids.device) - first_of_expert[sorted_expert]
    row_pairs = torch.full((max_blocks * block_m,), pairs, dtype=torch.int64, device=ids.device)
    row_pairs.scatter_(0, position, order)
    block_end = torch.cumsum(padded, 0) // block_m  # blocks up to and including each expert's
    block_expert = torch.searchsorted(block_end, torch.arange(max_blocks, device=ids.device), right=True)
    return row_pairs, block_expert


class Scales(NamedTuple):
    """8-bit experts' block scales: w13's and w2's [E, ceil(N/bn), ceil(K/bk)] float32 and the block (bn, bk)."""

    w13: torch.Tensor
    w2: torch.Tensor
    block: tuple[int, int]


def scale_args(w: torch.Tensor, scales: Scales | None, which: str) -> tuple[torch.Tensor, int, int, dict]:
    """(scale tensor, its rows and columns per expert, the kernel's SCALED / BN / BK) for one projection."""
    if scales is None:
        return w, 0, 0, dict(SCALED=False, BN=1, BK=1)
    s = (scales.w13 if which == "w13" else scales.w2).float().contiguous()
    bk = min(scales.block[1], next_pow2(w.shape[2]))  # one block spanning K: any power of two past K reads it
    return s, s.shape[1], s.shape[2], dict(SCALED=True, BN=scales.block[0], BK=bk)


def _k_tile(block_k: int, scales: Scales | None, k: int) -> int:
    """A K tile inside one scale block: BLOCK_K divides the block's columns (blocks are powers of two >= 16, or
    span K)."""
    if scales is None or scales.block[1] >= k:
        return block_k
    return min(block_k, scales.block[1])


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              activation: str = "silu", scales: Scales | None = None) -> torch.Tensor:
    """lz.fused_moe: x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights / ids [T, k] -> [T, H] in x's dtype; with
    `scales`, w13 and w2 are 8-bit with those block scales."""
    tokens, k = ids.shape
    experts, inner2, hidden = w13.shape
    inner = inner2 // 2
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    row_pairs, block_expert = align_pairs(ids, experts)
    blocks = block_expert.numel()
    h = torch.empty(blocks * BLOCK_M, inner, dtype=x.dtype, device=x.device)
    out = torch.zeros(tokens * k, hidden, dtype=torch.float32, device=x.device)
    if tokens == 0:
        return out.view(tokens, k, hidden).sum(1).to(x.dtype)
    act = "silu" if activation == "silu" else "gelu_tanh"
    block_n = 64
    s13, r13, c13, kw13 = scale_args(w13, scales, "w13")
    s2, r2, c2, kw2 = scale_args(w2, scales, "w2")
    _GATE_UP((blocks, triton.cdiv(inner, block_n)), x, w13, s13, h, row_pairs, block_expert, tokens * k, inner, hidden,
             experts, r13, c13, K=k, ACT=act, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
             BLOCK_K=_k_tile(BLOCK_K, scales, hidden), PRECISION=dot_precision(x.dtype), num_warps=4, **kw13)
    _DOWN((blocks, triton.cdiv(hidden, block_n)), h, w2, s2, out, row_pairs, block_expert,
          weights.reshape(-1).float().contiguous(), tokens * k, inner, hidden, experts, r2, c2, BLOCK_M=BLOCK_M,
          BLOCK_N=block_n, BLOCK_K=_k_tile(BLOCK_K, scales, inner), PRECISION=dot_precision(x.dtype), num_warps=4,
          **kw2)
    return out.view(tokens, k, hidden).sum(1).to(x.dtype)


def fused_moe_w8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 weights: torch.Tensor, ids: torch.Tensor, *, block_size: tuple[int, int],
                 activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_w8 through the grouped GEMMs."""
    return fused_moe(x, w13, w2, weights, ids, activation=activation,
                     scales=Scales(w13_scale, w2_scale, tuple(block_size)))
