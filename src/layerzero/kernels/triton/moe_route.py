"""A mixture of experts' routing in Triton: one program per token turns its router logits into the top-k experts
and their weights (softmax or sigmoid scores in float32, k rounds of max with ties to the lower expert id,
renormalized when asked) in one launch, where the torch composition takes six (softmax, top-k's sort and gather, a
reduction, a copy, the division): at batch 1 those cost ~15 µs a layer on an H200, almost the routed experts' read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from layerzero.kernels.triton.launch import Launcher, await_inputs, interpreting, last_dim_contiguous, next_pow2

if interpreting():
    from layerzero.kernels.triton import interpreter_fixes

    interpreter_fixes.install()


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, experts, stride, K: tl.constexpr, K_POW2: tl.constexpr,
                  E_POW2: tl.constexpr, SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr):
    await_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, E_POW2)
    ok = e < experts
    logit = tl.load(logits_ptr + token * stride + e, mask=ok, other=-float("inf")).to(tl.float32)
    if SOFTMAX:
        p = tl.exp(logit - tl.max(logit, 0))
        scores = p / tl.sum(p, 0)
    else:
        scores = 1.0 / (1.0 + tl.exp(-logit))
    # below every score, so padding is never picked; NaN too (a CUDA graph's padding rows hold whatever was there):
    # every id stays a valid expert, which the experts' kernels index by
    scores = tl.where(ok & (scores == scores), scores, -1.0)
    slot = tl.arange(0, K_POW2)
    picked_w = tl.zeros((K_POW2,), dtype=tl.float32)
    picked_id = tl.zeros((K_POW2,), dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(scores, 0)
        idx = tl.min(tl.where(scores == best, e, E_POW2), 0)
        picked_w = tl.where(slot == j, best, picked_w)
        picked_id = tl.where(slot == j, idx.to(tl.int64), picked_id)
        scores = tl.where(e == idx, -2.0, scores)
    if RENORMALIZE:
        picked_w = picked_w / tl.sum(picked_w, 0)
    keep = slot < K
    tl.store(weights_ptr + token * K + slot, picked_w, mask=keep)
    tl.store(ids_ptr + token * K + slot, picked_id, mask=keep)


_ROUTE = Launcher(_route_kernel)


def moe_route(logits: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """lz.moe_route: (weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E], E at most
    specs.MAX_ROUTED_EXPERTS (a token's scores stay in registers)."""
    tokens, experts = logits.shape
    logits = last_dim_contiguous(logits)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        _ROUTE((tokens,), logits, weights, ids, experts, logits.stride(0), K=top_k, K_POW2=next_pow2(top_k),
               E_POW2=next_pow2(experts), SOFTMAX=scoring == "softmax", RENORMALIZE=renormalize, num_warps=4)
    return weights, ids
