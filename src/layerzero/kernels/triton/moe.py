"""A mixture of experts' MLPs in Triton, two ways.

`fused_moe` (batches): the (token, expert) pairs sorted by expert and padded to the GEMM's row block, then one grouped
GEMM for gate and up with the activation in its epilogue, and one for down with the routing weight in its epilogue;
the pairs summed back per token.

Graph-safe: the sort and the padding are device ops (no host sync), and every buffer and grid is sized from the
shapes for the worst case (each expert's group padded by at most BLOCK_M - 1 rows: T * k + E * (BLOCK_M - 1) rows);
blocks past the used ones exit at once. Each row block holds one expert's pairs, so it reads that expert's weights
once: a decode step reads only the routed experts' weights, a large batch every expert's once.

`fused_moe_decode` (a few tokens): no sort at all. Each program of the gate+up kernel is one (token, expert) pair and a
slice of the intermediate columns, a matrix-vector product over that expert's rows; each program of the down kernel is
one token and a slice of the hidden columns, summing its k experts' products with their routing weights. Two launches
and no routing-dependent sizes; a pair's expert is read by that pair alone, so it pays only while pairs rarely share an
expert (few tokens): `MOE_DECODE_PAIRS` in layerzero.select.signatures is where it stops.

`fused_moe_w8` / `fused_moe_w8_decode` are the same two paths over experts kept 8-bit (an FP8 checkpoint's e4m3
experts, a GGUF's Q8_0 ones), so the routed experts stream in 8 bits (`SCALED`). The GEMMs keep a K tile inside one
scale block (BLOCK_K divides the block's columns): the tile's scales are one per weight row, loaded once per tile,
and multiply its partial products (tl.dot of the widened tile, then scaled per output column). The decode path's
tiles may span several blocks: each row's scales are loaded once per block and broadcast over its columns, and they
multiply the activations the tile meets. A first version gathered a scale for every weight element: batch 16 ran at
156 tok/s on the 30B shape, a tenth of the float path.
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
def _act(g, ACT: tl.constexpr):
    # silu(g) = g * sigmoid(g); gelu_tanh(g) = g * sigmoid(2z), z = sqrt(2/pi) (g + 0.044715 g^3); exp of -|arg| only
    arg = g if ACT == "silu" else 1.5957691216057308 * (g + 0.044715 * g * g * g)
    e = tl.exp(-tl.abs(arg))
    return g * tl.where(arg >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def _row_scales(s_ptr, expert, rows, rows_ok, k0, S_ROWS, S_COLS, BN: tl.constexpr, BK: tl.constexpr):
    """The scales of weight rows `rows` of `expert` in the K tile starting at k0 (inside one scale block)."""
    return tl.load(s_ptr + expert * S_ROWS * S_COLS + (rows // BN) * S_COLS + k0 // BK, mask=rows_ok, other=0.0)


@triton.jit
def _tile_scales(s_ptr, expert, rows, rows_ok, k0, S_ROWS, S_COLS, BN: tl.constexpr, BK: tl.constexpr,
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
    h = _act(gate, ACT) * up
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


@triton.jit
def _decode_gate_up_kernel(x_ptr, w_ptr, s_ptr, h_ptr, ids_ptr, inner, hidden, S_ROWS, S_COLS, K: tl.constexpr,
                           ACT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALED: tl.constexpr,
                           BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """h[pair] = act(x[token] @ gate_e.T) * (x[token] @ up_e.T) over BLOCK_N intermediate columns of one pair. Each
    next tile's weights are loaded before the current one's products are summed, so two tiles are in flight."""
    await_inputs(PDL)
    pair = tl.program_id(0).to(tl.int64)
    token = pair // K
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inner
    gate_rows = w_ptr + expert * 2 * inner * hidden + cols[:, None].to(tl.int64) * hidden
    up_rows = gate_rows + inner * hidden
    ks = tl.arange(0, BLOCK_K)
    m = col_ok[:, None] & (ks < hidden)[None, :]
    wg = tl.load(gate_rows + ks[None, :], mask=m, other=0.0)
    wu = tl.load(up_rows + ks[None, :], mask=m, other=0.0)
    gate = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + token * hidden + ks, mask=ks < hidden, other=0.0).to(tl.float32)[None, :]
        following = ks + BLOCK_K
        m = col_ok[:, None] & (following < hidden)[None, :]
        wg_next = tl.load(gate_rows + following[None, :], mask=m, other=0.0)
        wu_next = tl.load(up_rows + following[None, :], mask=m, other=0.0)
        if SCALED:
            sg = _tile_scales(s_ptr, expert, cols, col_ok, k0, S_ROWS, S_COLS, BN, BK, BLOCK_N, BLOCK_K)
            su = _tile_scales(s_ptr, expert, inner + cols, col_ok, k0, S_ROWS, S_COLS, BN, BK, BLOCK_N, BLOCK_K)
            gate += wg.to(tl.float32) * (sg * xk)
            up += wu.to(tl.float32) * (su * xk)
        else:
            gate += wg.to(tl.float32) * xk
            up += wu.to(tl.float32) * xk
        wg, wu = wg_next, wu_next
    h = _act(tl.sum(gate, 1), ACT) * tl.sum(up, 1)
    tl.store(h_ptr + pair * inner + cols, h.to(h_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _decode_down_kernel(h_ptr, w_ptr, s_ptr, out_ptr, ids_ptr, weights_ptr, inner, hidden, S_ROWS, S_COLS,
                        K: tl.constexpr, K_POW2: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SCALED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
    """out[token] = sum_j weight[token, j] * (h[pair j] @ down_e.T) over BLOCK_N hidden columns of one token: the k
    experts' rows loaded together as one [k, BLOCK_N, BLOCK_K] tile, so each load keeps many bytes in flight. The
    expert ids and the first tile of weights are loaded before the PDL wait, while the gate+up kernel before it still
    runs: the ids were written before that kernel began (launch.py), the weights by no step."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.arange(0, K_POW2)
    slot_ok = slot < K
    pair = token * K + slot
    expert = tl.load(ids_ptr + pair, mask=slot_ok, other=0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    rows = w_ptr + expert[:, None, None] * hidden * inner + cols[None, :, None].to(tl.int64) * inner
    row_ok = slot_ok[:, None, None] & col_ok[None, :, None]
    ks = tl.arange(0, BLOCK_K)
    w = tl.load(rows + ks[None, None, :], mask=row_ok & (ks < inner)[None, None, :], other=0.0)
    await_inputs(PDL)
    acc = tl.zeros((K_POW2, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, inner, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < inner
        hk = tl.load(h_ptr + pair[:, None] * inner + ks[None, :], mask=slot_ok[:, None] & k_ok[None, :], other=0.0)
        wf = w.to(tl.float32)
        if SCALED:  # the k experts' rows as K_POW2 * BLOCK_N rows of one scale tile
            flat = (expert[:, None] * S_ROWS * BN + cols[None, :]).reshape(K_POW2 * BLOCK_N)
            ok = (slot_ok[:, None] & col_ok[None, :]).reshape(K_POW2 * BLOCK_N)
            sw = _tile_scales(s_ptr, 0, flat, ok, k0, S_ROWS, S_COLS, BN, BK, K_POW2 * BLOCK_N, BLOCK_K)
            acc += wf * (sw.reshape(K_POW2, BLOCK_N, BLOCK_K) * hk.to(tl.float32)[:, None, :])
        else:
            acc += wf * hk.to(tl.float32)[:, None, :]
        following = ks + BLOCK_K  # the next tile's load, issued before this one's products are summed
        w = tl.load(rows + following[None, None, :], mask=row_ok & (following < inner)[None, None, :], other=0.0)
    weight = tl.load(weights_ptr + pair, mask=slot_ok, other=0.0).to(tl.float32)
    out = tl.sum(tl.sum(acc, 2) * weight[:, None], 0)
    tl.store(out_ptr + token * hidden + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


_GATE_UP = Launcher(_gate_up_kernel)
_DOWN = Launcher(_down_kernel)
_DECODE_GATE_UP = Launcher(_decode_gate_up_kernel)
_DECODE_DOWN = Launcher(_decode_down_kernel)
# (BLOCK_N, BLOCK_K, warps) of the decode path's two kernels (benchmarks/moe_decode_tiles.py measures the choices)
DECODE_GATE_UP_TILE = (8, 256, 4)
DECODE_DOWN_TILE = (8, 256, 4)
# the same for 8-bit experts (`--fp8` of the benchmark: 256-column tiles keep as many bytes in flight as bf16's)
DECODE_GATE_UP_TILE_W8 = (16, 256, 4)
DECODE_DOWN_TILE_W8 = (8, 256, 4)


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


def _scale_args(w: torch.Tensor, scales: Scales | None, which: str) -> tuple[torch.Tensor, int, int, dict]:
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
    s13, r13, c13, kw13 = _scale_args(w13, scales, "w13")
    s2, r2, c2, kw2 = _scale_args(w2, scales, "w2")
    _GATE_UP((blocks, triton.cdiv(inner, block_n)), x, w13, s13, h, row_pairs, block_expert, tokens * k, inner, hidden,
             experts, r13, c13, K=k, ACT=act, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
             BLOCK_K=_k_tile(BLOCK_K, scales, hidden), PRECISION=dot_precision(x.dtype), num_warps=4, **kw13)
    _DOWN((blocks, triton.cdiv(hidden, block_n)), h, w2, s2, out, row_pairs, block_expert,
          weights.reshape(-1).float().contiguous(), tokens * k, inner, hidden, experts, r2, c2, BLOCK_M=BLOCK_M,
          BLOCK_N=block_n, BLOCK_K=_k_tile(BLOCK_K, scales, inner), PRECISION=dot_precision(x.dtype), num_warps=4,
          **kw2)
    return out.view(tokens, k, hidden).sum(1).to(x.dtype)


def fused_moe_decode(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     *, activation: str = "silu", scales: Scales | None = None) -> torch.Tensor:
    """lz.fused_moe for a few tokens: one program per (pair, column slice), no sort; [T, H] in x's dtype; with
    `scales`, w13 and w2 are 8-bit with those block scales."""
    tokens, k = ids.shape
    experts, inner2, hidden = w13.shape
    inner = inner2 // 2
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    ids, weights = ids.contiguous(), weights.float().contiguous()
    h = torch.empty(tokens * k, inner, dtype=x.dtype, device=x.device)
    act = "silu" if activation == "silu" else "gelu_tanh"
    gate_up, down = (DECODE_GATE_UP_TILE, DECODE_DOWN_TILE) if scales is None else (DECODE_GATE_UP_TILE_W8,
                                                                                   DECODE_DOWN_TILE_W8)
    decode_gate_up(x, w13, h, ids, act, *gate_up, scales=scales)
    decode_down(h, w2, out, ids, weights, *down, scales=scales)
    return out


def decode_gate_up(x: torch.Tensor, w13: torch.Tensor, h: torch.Tensor, ids: torch.Tensor, act: str, block_n: int,
                   block_k: int, warps: int, scales: Scales | None = None) -> None:
    """The decode path's first kernel at a given tile: h [T * k, I] from x [T, H] and each pair's expert."""
    inner, hidden = w13.shape[1] // 2, w13.shape[2]
    s, rows, cols, kw = _scale_args(w13, scales, "w13")
    _DECODE_GATE_UP((ids.numel(), triton.cdiv(inner, block_n)), x, w13, s, h, ids, inner, hidden, rows, cols,
                    K=ids.shape[1], ACT=act, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **kw)


def decode_down(h: torch.Tensor, w2: torch.Tensor, out: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                block_n: int, block_k: int, warps: int, scales: Scales | None = None) -> None:
    """The decode path's second kernel at a given tile: out [T, H] from h and the routing weights (float32)."""
    tokens, k = ids.shape
    hidden, inner = w2.shape[1], w2.shape[2]
    s, rows, cols, kw = _scale_args(w2, scales, "w2")
    _DECODE_DOWN((tokens, triton.cdiv(hidden, block_n)), h, w2, s, out, ids, weights, inner, hidden, rows, cols, K=k,
                 K_POW2=next_pow2(k), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **kw)


def fused_moe_w8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 weights: torch.Tensor, ids: torch.Tensor, *, block_size: tuple[int, int],
                 activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_w8 through the grouped GEMMs."""
    return fused_moe(x, w13, w2, weights, ids, activation=activation,
                     scales=Scales(w13_scale, w2_scale, tuple(block_size)))


def fused_moe_w8_decode(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                        w2_scale: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
                        block_size: tuple[int, int], activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_w8 for a few tokens, without the sort."""
    return fused_moe_decode(x, w13, w2, weights, ids, activation=activation,
                            scales=Scales(w13_scale, w2_scale, tuple(block_size)))
