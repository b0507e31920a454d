"""A mixture of experts' MLPs for a few tokens in Triton: the decode path, no sort at all.

Each program of the gate+up kernel is one (token, expert) pair and a slice of the intermediate columns, a
matrix-vector product over that expert's rows; each program of the down kernel is one token and a slice of the hidden
columns, summing its k experts' products with their routing weights. Two launches and no routing-dependent sizes; a
pair's expert is read by that pair alone, so it pays only while pairs rarely share an expert (few tokens):
`MOE_DECODE_PAIRS` in layerzero.select.signatures is where it stops.

The routing comes in one of two forms (`Routing`): each pair's expert ids and weights (`fused_moe_decode`, after a
router kernel), or the router's logits, which each kernel ranks itself (`fused_moe_routed_decode`, after the
norm-and-router kernel of moe_route.py): the gate+up kernel after its PDL wait, the down kernel before it (the logits
were written two kernels back). That takes a kernel and its memory round trips off every MoE layer's critical path
(docs/models.md). `fused_moe_w8_decode` is the same path over 8-bit experts (moe.py's `Scales`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, next_pow2
from layerzero.kernels.triton.moe import Scales, activate, scale_args, tile_scales
from layerzero.kernels.triton.moe_route import ranked, ranked_one

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@triton.jit
def _decode_gate_up_kernel(x_ptr, w_ptr, s_ptr, h_ptr, ids_ptr, logits_ptr, experts, inner, hidden, S_ROWS, S_COLS,
                           K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr, ROUTE: tl.constexpr,
                           SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr, ACT: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALED: tl.constexpr, BN: tl.constexpr,
                           BK: tl.constexpr, PDL: tl.constexpr):
    """h[pair] = act(x[token] @ gate_e.T) * (x[token] @ up_e.T) over BLOCK_N intermediate columns of one pair, its
    expert read from the ids or, with ROUTE, ranked from the token's router logits. Each next tile's weights are
    loaded before the current one's products are summed, so two tiles are in flight."""
    await_inputs(PDL)
    pair = tl.program_id(0).to(tl.int64)
    token = pair // K
    if ROUTE:
        expert = ranked_one(logits_ptr + token * experts, experts, (pair % K).to(tl.int32), E_POW2)
    else:
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
            sg = tile_scales(s_ptr, expert, cols, col_ok, k0, S_ROWS, S_COLS, BN, BK, BLOCK_N, BLOCK_K)
            su = tile_scales(s_ptr, expert, inner + cols, col_ok, k0, S_ROWS, S_COLS, BN, BK, BLOCK_N, BLOCK_K)
            gate += wg.to(tl.float32) * (sg * xk)
            up += wu.to(tl.float32) * (su * xk)
        else:
            gate += wg.to(tl.float32) * xk
            up += wu.to(tl.float32) * xk
        wg, wu = wg_next, wu_next
    h = activate(tl.sum(gate, 1), ACT) * tl.sum(up, 1)
    tl.store(h_ptr + pair * inner + cols, h.to(h_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _decode_down_kernel(h_ptr, w_ptr, s_ptr, out_ptr, ids_ptr, weights_ptr, logits_ptr, experts, inner, hidden,
                        S_ROWS, S_COLS, K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr,
                        ROUTE: tl.constexpr, SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, SCALED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        PDL: tl.constexpr):
    """out[token] = sum_j weight[token, j] * (h[pair j] @ down_e.T) over BLOCK_N hidden columns of one token: the k
    experts' rows loaded together as one [k, BLOCK_N, BLOCK_K] tile, so each load keeps many bytes in flight. The
    routing (the ids and weights, or with ROUTE the logits they are ranked from) and the first tile of weights are
    loaded before the PDL wait, while the gate+up kernel before it still runs: the routing was written before that
    kernel began (launch.py), the weights by no step."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.arange(0, K_POW2)
    slot_ok = slot < K
    pair = token * K + slot
    if ROUTE:
        weights, ids = ranked(logits_ptr + token * experts, experts, K, K_POW2, E_POW2, SOFTMAX, RENORMALIZE)
        weight, expert = tl.max(weights, 0), tl.max(ids, 0)
    else:
        expert = tl.load(ids_ptr + pair, mask=slot_ok, other=0).to(tl.int64)
        weight = tl.load(weights_ptr + pair, mask=slot_ok, other=0.0).to(tl.float32)
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
            sw = tile_scales(s_ptr, 0, flat, ok, k0, S_ROWS, S_COLS, BN, BK, K_POW2 * BLOCK_N, BLOCK_K)
            acc += wf * (sw.reshape(K_POW2, BLOCK_N, BLOCK_K) * hk.to(tl.float32)[:, None, :])
        else:
            acc += wf * hk.to(tl.float32)[:, None, :]
        following = ks + BLOCK_K  # the next tile's load, issued before this one's products are summed
        w = tl.load(rows + following[None, None, :], mask=row_ok & (following < inner)[None, None, :], other=0.0)
    out = tl.sum(tl.sum(acc, 2) * weight[:, None], 0)
    tl.store(out_ptr + token * hidden + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


_DECODE_GATE_UP = Launcher(_decode_gate_up_kernel)
_DECODE_DOWN = Launcher(_decode_down_kernel)
# (BLOCK_N, BLOCK_K, warps) of the two kernels (benchmarks/moe_decode_tiles.py measures the choices)
DECODE_GATE_UP_TILE = (8, 256, 4)
DECODE_DOWN_TILE = (8, 256, 4)
# the same for 8-bit experts (`--fp8` of the benchmark: 256-column tiles keep as many bytes in flight as bf16's)
DECODE_GATE_UP_TILE_W8 = (16, 256, 4)
DECODE_DOWN_TILE_W8 = (8, 256, 4)


class Routing(NamedTuple):
    """A step's routing for the two kernels: each pair's expert `ids` [T, k] int64 and float32 `weights`, or (with
    `logits`) the router's float32 logits [T, E] ranked in the kernels into the top `top_k`, scored by softmax or
    sigmoid and renormalized as asked (what lz.moe_route computes)."""

    tokens: int
    top_k: int
    ids: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    renormalize: bool = False
    softmax: bool = True

    @staticmethod
    def of_ids(ids: torch.Tensor, weights: torch.Tensor) -> Routing:
        return Routing(ids.shape[0], ids.shape[1], ids.contiguous(), weights.float().contiguous())

    def kernel_args(self) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], dict]:
        """((ids, weights, logits, experts), the routing constexprs): unused pointers repeat a used one."""
        k = dict(K=self.top_k, K_POW2=next_pow2(self.top_k))
        if self.logits is None:
            return (self.ids, self.weights, self.ids, 1), dict(k, E_POW2=1, ROUTE=False, SOFTMAX=True,
                                                                RENORMALIZE=False)
        logits = self.logits
        return (logits, logits, logits, logits.shape[1]), dict(k, E_POW2=next_pow2(logits.shape[1]), ROUTE=True,
                                                                SOFTMAX=self.softmax, RENORMALIZE=self.renormalize)


def _decode(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, routing: Routing, activation: str,
            scales: Scales | None) -> torch.Tensor:
    inner, hidden = w13.shape[1] // 2, w13.shape[2]
    out = torch.empty(routing.tokens, hidden, dtype=x.dtype, device=x.device)
    if routing.tokens == 0:
        return out
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    h = torch.empty(routing.tokens * routing.top_k, inner, dtype=x.dtype, device=x.device)
    act = "silu" if activation == "silu" else "gelu_tanh"
    gate_up, down = (DECODE_GATE_UP_TILE, DECODE_DOWN_TILE) if scales is None else (DECODE_GATE_UP_TILE_W8,
                                                                                   DECODE_DOWN_TILE_W8)
    decode_gate_up(x, w13, h, routing, act, *gate_up, scales=scales)
    decode_down(h, w2, out, routing, *down, scales=scales)
    return out


def fused_moe_decode(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                     *, activation: str = "silu", scales: Scales | None = None) -> torch.Tensor:
    """lz.fused_moe for a few tokens: one program per (pair, column slice), no sort; [T, H] in x's dtype; with
    `scales`, w13 and w2 are 8-bit with those block scales."""
    return _decode(x, w13, w2, Routing.of_ids(ids, weights), activation, scales)


def fused_moe_routed_decode(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, top_k: int,
                            *, renormalize: bool, scoring: str = "softmax", activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_routed for a few tokens: the two kernels rank the router's logits [T, E] themselves."""
    routing = Routing(logits.shape[0], top_k, logits=logits.float().contiguous(), renormalize=renormalize,
                      softmax=scoring == "softmax")
    return _decode(x, w13, w2, routing, activation, None)


def fused_moe_w8_decode(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                        w2_scale: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
                        block_size: tuple[int, int], activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_w8 for a few tokens, without the sort."""
    return fused_moe_decode(x, w13, w2, weights, ids, activation=activation,
                            scales=Scales(w13_scale, w2_scale, tuple(block_size)))


def decode_gate_up(x: torch.Tensor, w13: torch.Tensor, h: torch.Tensor, routing: Routing, act: str, block_n: int,
                   block_k: int, warps: int, scales: Scales | None = None) -> None:
    """The first kernel at a given tile: h [T * k, I] from x [T, H] and each pair's expert."""
    inner, hidden = w13.shape[1] // 2, w13.shape[2]
    s, rows, cols, kw = scale_args(w13, scales, "w13")
    (ids, _, logits, experts), route = routing.kernel_args()
    _DECODE_GATE_UP((routing.tokens * routing.top_k, triton.cdiv(inner, block_n)), x, w13, s, h, ids, logits, experts,
                    inner, hidden, rows, cols, ACT=act, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **route,
                    **kw)


def decode_down(h: torch.Tensor, w2: torch.Tensor, out: torch.Tensor, routing: Routing, block_n: int, block_k: int,
                warps: int, scales: Scales | None = None) -> None:
    """The second kernel at a given tile: out [T, H] from h and the routing's weights."""
    hidden, inner = w2.shape[1], w2.shape[2]
    s, rows, cols, kw = scale_args(w2, scales, "w2")
    (ids, weights, logits, experts), route = routing.kernel_args()
    _DECODE_DOWN((routing.tokens, triton.cdiv(hidden, block_n)), h, w2, s, out, ids, weights, logits, experts, inner,
                 hidden, rows, cols, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **route, **kw)
