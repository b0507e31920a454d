"""A mixture of experts' routing in Triton.

`moe_route`: one program per token turns its router logits into the top-k experts and their weights (softmax or
sigmoid scores in float32, k rounds of max with ties to the lower expert id, renormalized when asked) in one launch,
where the torch composition takes six (softmax, top-k's sort and gather, a reduction, a copy, the division).

`moe_gate_decode`: the router's matmul and the routing of at most ROWS tokens in one launch. At batch 1 the router
(0.5 MiB on Qwen3-30B-A3B) and the routing cost a cuBLAS GEMV and a routing kernel, ~8 µs a layer on an H200, for
~0.1 µs of bytes (benchmarks/reports/moe_kernel_profile_h200.md). Here the programs split the experts and the
hidden dimension, each loads its slice of the router before waiting on the previous kernel (the router is never
written by a step; see launch.py), writes its float32 partial logits, and the last program to finish (a counter
in device memory, reset by that program) sums the partials in a fixed order and routes the tokens as one tile of
rows (a loop over tokens there ran batch 16 at 0.87x: benchmarks/reports/moe_gate_h200.md).
`moe_gate` for more tokens: float32 logits from one matmul, then `moe_route`. Both compute the logits in float32,
so a token's experts do not depend on how many tokens share its step.

`fused_add_rms_norm_router_decode`: the residual add, the RMSNorm before the experts and the router's logits in one
launch, for the decode path whose expert kernels rank the logits themselves (`ranked`, `ranked_one`, moe_decode.py),
so no routing kernel runs between the norm and the experts (benchmarks/reports/moe_fusion_ceiling_h200.md). Each
program holds a slice of the router's experts (loaded before its PDL wait) and recomputes its token's add and norm (a
row of at most MAX_NORM_ROUTER_HIDDEN columns, read from L2); the first stores them.
`fused_add_rms_norm_router_splitk` is that with the attention's O projection before it: the split-K GEMV's float32
slices (gemv.splitk_partials) summed where the kernel reads its x, so no sum kernel runs between them.

The ranking there is by logit (softmax and sigmoid keep its order; experts whose scores would round to the same
float32 may come in the other order than `_pick`'s) over int64 keys, the logit's order-preserving bits then the id
reversed, so one max finds the next expert, ties to the lower id. The keys sit in a [4, E] tile, a copy per warp of
the 4-warp kernels that use it, so every max stays inside a warp: on 1-D keys spread over the warps each of the k
rounds crossed them, and the step ran 1.4% slower than with the router kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.torch_backend import router_logits
from layerzero.kernels.triton.gemv import projected_at, splitk_partials
from layerzero.kernels.triton.launch import (Launcher, await_inputs, dot_precision, interpreting, last_dim_contiguous,
                                             next_pow2)
from layerzero.kernels.triton.specs import FUSED_SPLITK_TILE, MAX_NORM_ROUTER_HIDDEN

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()

ROWS = 16  # tokens moe_gate_decode takes: tl.dot's smallest M
BLOCK_E = 16  # experts per program
MAX_CHUNK = 256  # hidden columns per program
_ROUTER_TILE = 8192  # router elements a norm-and-router program holds: 64 a thread at 4 warps


@triton.jit
def _pick(logit, e, experts, R: tl.constexpr, K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr,
          SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr):
    """(weights, ids) [R, K_POW2] of R tokens' logits [R, E_POW2], e [1, E_POW2] (padding beyond `experts` ignored)."""
    ok = e < experts
    logit = tl.where(ok, logit, -float("inf"))
    if SOFTMAX:
        p = tl.exp(logit - tl.max(logit, 1)[:, None])
        scores = p / tl.sum(p, 1)[:, None]
    else:
        scores = 1.0 / (1.0 + tl.exp(-logit))
    # below every score, so padding is never picked; NaN too (a CUDA graph's padding rows hold whatever was there):
    # every id stays a valid expert, which the experts' kernels index by
    scores = tl.where(ok & (scores == scores), scores, -1.0)
    slot = tl.arange(0, K_POW2)[None, :]
    picked_w = tl.zeros((R, K_POW2), dtype=tl.float32)
    picked_id = tl.zeros((R, K_POW2), dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(scores, 1)
        idx = tl.min(tl.where(scores == best[:, None], e, E_POW2), 1)
        picked_w = tl.where(slot == j, best[:, None], picked_w)
        picked_id = tl.where(slot == j, idx[:, None].to(tl.int64), picked_id)
        scores = tl.where(e == idx[:, None], -2.0, scores)
    if RENORMALIZE:
        picked_w = picked_w / tl.sum(picked_w, 1)[:, None]
    return picked_w, picked_id


@triton.jit
def _keys(row_ptr, experts, E_POW2: tl.constexpr):
    """(keys, logits) [4, E_POW2] of one token's float32 logits at row_ptr (4 copies, one per warp; padding -inf).
    A key is the logit's order-preserving bits, then the id reversed, so one max gives the highest logit and, among
    equal ones, the lowest id; NaN and padding last."""
    r = tl.arange(0, 4)[:, None]
    e = tl.arange(0, E_POW2)[None, :]
    ok = (e < experts) & (r >= 0)
    logit = tl.load(row_ptr + e + 0 * r, mask=ok, other=-float("inf"))
    bits = logit.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 2147483647)
    ordered = tl.where(ok & (logit == logit), ordered, -2147483648)
    return ordered.to(tl.int64) * 4294967296 + (E_POW2 - 1 - e), logit


@triton.jit
def _key_logit(best):
    """The logit a key was made from."""
    ordered = (best >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 2147483647).to(tl.float32, bitcast=True)


@triton.jit
def _key_id(best, E_POW2: tl.constexpr):
    """The expert a key was made from."""
    return E_POW2 - 1 - (best & 4294967295)


@triton.jit
def _next_key(key):
    """(the highest key of each row [4, 1], the keys without it): one round of the ranking, a max inside a warp."""
    best = tl.max(key, 1)[:, None]
    return best, tl.where(key == best, -9223372036854775807, key)


@triton.jit
def ranked_one(row_ptr, experts, slot, E_POW2: tl.constexpr):
    """The expert of rank `slot` (0: the highest logit) among one token's: slot + 1 rounds of one max in a warp, all
    a gate+up program needs before it can address its weights."""
    key, _ = _keys(row_ptr, experts, E_POW2)
    best, key = _next_key(key)
    for _ in range(slot):
        best, key = _next_key(key)
    return tl.max(tl.max(_key_id(best, E_POW2), 1), 0)


@triton.jit
def ranked(row_ptr, experts, K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr, SOFTMAX: tl.constexpr,
           RENORMALIZE: tl.constexpr):
    """(weights, ids) [4, K_POW2], every row alike: the k experts of the highest logits in rank order, weighted as
    `moe_route` weighs them (softmax over every expert, or over the k when renormalized; or sigmoid); slots from K on
    hold weight 0 and expert 0."""
    key, logit = _keys(row_ptr, experts, E_POW2)
    slot = tl.arange(0, K_POW2)[None, :]
    picked = tl.full((4, K_POW2), -float("inf"), dtype=tl.float32)
    ids = tl.zeros((4, K_POW2), dtype=tl.int64)
    for j in tl.static_range(K):
        best, key = _next_key(key)
        picked = tl.where(slot == j, _key_logit(best), picked)
        ids = tl.where(slot == j, _key_id(best, E_POW2), ids)
    if SOFTMAX:
        top = tl.max(picked, 1)[:, None]
        weights = tl.exp(picked - top)
        if not RENORMALIZE:
            weights = weights / tl.sum(tl.exp(logit - top), 1)[:, None]
    else:
        weights = tl.where(slot < K, 1.0 / (1.0 + tl.exp(-picked)), 0.0)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 1)[:, None]
    return weights, ids


@triton.jit
def _norm_router_kernel(x_ptr, r_ptr, w_ptr, router_ptr, out_ptr, sum_ptr, logits_ptr, experts, hidden, x_stride,
                        x_slice, r_stride, eps, w_offset, SLICES: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    token = tl.program_id(1).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    e_ok, h_ok = e < experts, h < hidden
    # the router's slice and the norm's weight before the wait: no step writes them
    router = tl.load(router_ptr + e[:, None].to(tl.int64) * hidden + h[None, :], mask=e_ok[:, None] & h_ok[None, :],
                     other=0.0)
    w = tl.load(w_ptr + h, mask=h_ok, other=0.0).to(tl.float32) + w_offset
    await_inputs(PDL)
    x = projected_at(x_ptr, token * x_stride + h, h_ok, x_slice, SLICES, out_ptr.dtype.element_ty)
    s = (x.to(tl.float32) + tl.load(r_ptr + token * r_stride + h, mask=h_ok, other=0.0).to(tl.float32)
         ).to(sum_ptr.dtype.element_ty)
    sf = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(sf * sf, axis=0) / hidden + eps)
    normed = (sf * rstd * w).to(out_ptr.dtype.element_ty)
    if tl.program_id(0) == 0:
        tl.store(sum_ptr + token * hidden + h, s, mask=h_ok)
        tl.store(out_ptr + token * hidden + h, normed, mask=h_ok)
    logit = tl.sum(router.to(tl.float32) * normed.to(tl.float32)[None, :], 1)
    tl.store(logits_ptr + token * experts + e, logit, mask=e_ok)


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, experts, stride, K: tl.constexpr, K_POW2: tl.constexpr,
                  E_POW2: tl.constexpr, SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_POW2)[None, :]
    logit = tl.load(logits_ptr + token * stride + e, mask=e < experts, other=0.0).to(tl.float32)
    picked_w, picked_id = _pick(logit, e, experts, 1, K, K_POW2, E_POW2, SOFTMAX, RENORMALIZE)
    slot = tl.arange(0, K_POW2)[None, :]
    tl.store(weights_ptr + token * K + slot, picked_w, mask=slot < K)
    tl.store(ids_ptr + token * K + slot, picked_id, mask=slot < K)


@triton.jit
def _gate_kernel(x_ptr, router_ptr, part_ptr, count_ptr, weights_ptr, ids_ptr, tokens, experts, hidden, x_stride,
                 K: tl.constexpr, K_POW2: tl.constexpr, E_POW2: tl.constexpr, BLOCK: tl.constexpr,
                 CHUNK: tl.constexpr, SPLITS: tl.constexpr, TILE_ROWS: tl.constexpr, SOFTMAX: tl.constexpr,
                 RENORMALIZE: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr):
    split = tl.program_id(1)
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    h = split * CHUNK + tl.arange(0, CHUNK)
    e_ok, h_ok = e < experts, h < hidden
    w = tl.load(router_ptr + e[:, None].to(tl.int64) * hidden + h[None, :], mask=e_ok[:, None] & h_ok[None, :],
                other=0.0)  # before the wait: no step writes the router
    await_inputs(PDL)
    rows = tl.arange(0, TILE_ROWS)[:, None]
    live = rows < tokens
    x = tl.load(x_ptr + rows * x_stride + h[None, :], mask=live & h_ok[None, :], other=0.0)
    part = tl.dot(x, tl.trans(w), input_precision=PRECISION)  # [ROWS, BLOCK] float32
    tl.store(part_ptr + (split * TILE_ROWS + rows) * experts + e[None, :], part, mask=live & e_ok[None, :])
    tl.debug_barrier()  # every thread's partials stored before this program counts itself done
    done = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) * SPLITS - 1:  # the last program: every partial is visible
        every = tl.arange(0, E_POW2)[None, :]
        logit = tl.zeros((TILE_ROWS, E_POW2), dtype=tl.float32)
        for s in tl.static_range(SPLITS):  # a fixed order: the same bits whichever program finished last
            logit += tl.load(part_ptr + (s * TILE_ROWS + rows) * experts + every, mask=live & (every < experts),
                             other=0.0, cache_modifier=".cg")
        picked_w, picked_id = _pick(logit, every, experts, TILE_ROWS, K, K_POW2, E_POW2, SOFTMAX, RENORMALIZE)
        slot = tl.arange(0, K_POW2)[None, :]
        tl.store(weights_ptr + rows * K + slot, picked_w, mask=live & (slot < K))
        tl.store(ids_ptr + rows * K + slot, picked_id, mask=live & (slot < K))
        tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")


_ROUTE = Launcher(_route_kernel)
_GATE = Launcher(_gate_kernel)
_NORM_ROUTER = Launcher(_norm_router_kernel)
# one counter per device, zeroed when made and left zeroed by every launch (its last program resets it); gate
# launches on a device run one after another (one stream), so they never share it at once
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counter(device: torch.device) -> torch.Tensor:
    counter = _COUNTERS.get(device)
    if counter is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("moe_gate_decode: the first call on a device must run outside a CUDA graph capture "
                               "(its zeroed counter is made then); warm up before capturing")
        counter = _COUNTERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return counter


def _outputs(tokens: int, top_k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(tokens, top_k, dtype=torch.float32, device=device),
            torch.empty(tokens, top_k, dtype=torch.int64, device=device))


def moe_route(logits: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """lz.moe_route: (weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E], E at most
    specs.MAX_ROUTED_EXPERTS (a token's scores stay in registers)."""
    tokens, experts = logits.shape
    logits = last_dim_contiguous(logits)
    weights, ids = _outputs(tokens, top_k, logits.device)
    if tokens:
        _ROUTE((tokens,), logits, weights, ids, experts, logits.stride(0), K=top_k, K_POW2=next_pow2(top_k),
               E_POW2=next_pow2(experts), SOFTMAX=scoring == "softmax", RENORMALIZE=renormalize, num_warps=4)
    return weights, ids


def moe_gate(x: torch.Tensor, router: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """lz.moe_gate for any number of tokens: float32 logits x [T, H] @ router [E, H]^T, then `moe_route`."""
    return moe_route(router_logits(x, router), top_k, renormalize=renormalize, scoring=scoring)


def moe_gate_decode(x: torch.Tensor, router: torch.Tensor, top_k: int, *, renormalize: bool,
                    scoring: str = "softmax") -> tuple[torch.Tensor, torch.Tensor]:
    """lz.moe_gate for at most ROWS tokens in one launch (module docstring)."""
    tokens, hidden = x.shape
    experts = router.shape[0]
    if tokens > ROWS:
        raise ValueError(f"moe_gate_decode takes at most {ROWS} tokens, got {tokens}")
    x, router = last_dim_contiguous(x), router.contiguous()
    if router.dtype != x.dtype:
        router = router.to(x.dtype)
    weights, ids = _outputs(tokens, top_k, x.device)
    if not tokens:
        return weights, ids
    chunk = min(MAX_CHUNK, max(16, next_pow2(hidden)))
    splits = triton.cdiv(hidden, chunk)
    partials = torch.empty(splits, ROWS, experts, dtype=torch.float32, device=x.device)
    _GATE((triton.cdiv(experts, BLOCK_E), splits), x, router, partials, _counter(x.device), weights, ids, tokens,
          experts, hidden, x.stride(0), K=top_k, K_POW2=next_pow2(top_k), E_POW2=next_pow2(experts), BLOCK=BLOCK_E,
          CHUNK=chunk, SPLITS=splits, TILE_ROWS=ROWS, SOFTMAX=scoring == "softmax", RENORMALIZE=renormalize,
          PRECISION=dot_precision(x.dtype), num_warps=4)
    return weights, ids


def fused_add_rms_norm_router_decode(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                     router: torch.Tensor, proj: torch.Tensor | None = None, *, eps: float,
                                     weight_offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lz.fused_add_rms_norm_router for a few tokens in one launch (module docstring): (normed in x's dtype, the sum
    in the wider dtype, float32 logits [T, E]). With `proj`, x is projected first by lz.linear."""
    if proj is not None:
        import layerzero.api as lz  # late: the api's dispatch loads this module

        x = lz.linear(x, proj)
    x = last_dim_contiguous(x)
    return _norm_router(x, x.dtype, (x.stride(0), 0, 0), residual, weight, router, eps, weight_offset)


def fused_add_rms_norm_router_splitk(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                     router: torch.Tensor, proj: torch.Tensor, *, eps: float, weight_offset: float
                                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm_router_decode` with its projection: x [T, K] through the split-K GEMV
    (FUSED_SPLITK_TILE), whose float32 slices the norm's kernel sums where it reads them (no sum kernel between)."""
    if x.dim() != 2 or proj.dim() != 2 or proj.shape[1] != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and proj {tuple(proj.shape)} do not fit")
    partials = splitk_partials(x, proj, FUSED_SPLITK_TILE)  # [SPLITS, T, H] float32
    return _norm_router(partials, x.dtype, (partials.stride(1), partials.stride(0), partials.shape[0]), residual,
                        weight, router, eps, weight_offset)


def _norm_router(rows: torch.Tensor, dtype: torch.dtype, layout: tuple[int, int, int], residual: torch.Tensor,
                 weight: torch.Tensor, router: torch.Tensor, eps: float, weight_offset: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The norm-and-router kernel over `rows`: x [T, H] in `dtype`, or a projection's split-K partials [S, T, H];
    `layout`: (token stride, slice stride, slices), slices 0 for x."""
    tokens, hidden = residual.shape
    experts = router.shape[0]
    if rows.shape[-2:] != (tokens, hidden) or weight.shape != (hidden,) or router.shape[1] != hidden:
        raise ValueError(f"x {tuple(rows.shape[-2:])}, residual {tuple(residual.shape)}, weight "
                         f"{tuple(weight.shape)} and router {tuple(router.shape)} do not fit")
    if hidden > MAX_NORM_ROUTER_HIDDEN:
        raise ValueError(f"a hidden size of {hidden}: the norm-and-router kernel holds at most "
                         f"{MAX_NORM_ROUTER_HIDDEN} columns a row")
    residual, router = last_dim_contiguous(residual), router.contiguous()
    normed = torch.empty((tokens, hidden), dtype=dtype, device=rows.device)
    summed = torch.empty((tokens, hidden), dtype=torch.promote_types(dtype, residual.dtype), device=rows.device)
    logits = torch.empty(tokens, experts, dtype=torch.float32, device=rows.device)
    if tokens:
        token_stride, slice_stride, slices = layout
        block_h = next_pow2(hidden)
        block_e = max(1, min(next_pow2(experts), _ROUTER_TILE // block_h))
        _NORM_ROUTER((triton.cdiv(experts, block_e), tokens), rows, residual, weight.contiguous(), router, normed,
                     summed, logits, experts, hidden, token_stride, slice_stride, residual.stride(0), eps,
                     weight_offset, SLICES=slices, BLOCK_E=block_e, BLOCK_H=block_h, num_warps=4)
    return normed, summed, logits
