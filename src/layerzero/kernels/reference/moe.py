"""Mixture of experts: routing and the experts' gated MLPs, as plain compositions of torch ops.

`moe_route` turns router logits [T, E] into each token's top-k experts and their weights: scores are the softmax (or
sigmoid) of the logits in float32, the k highest are taken (ties in torch.topk's own order), and
with `renormalize` their weights are divided by their sum (Mixtral always; Qwen 3 MoE when `norm_topk_prob`).
`moe_gate` is the router's matmul (in float32) and `moe_route` together.
`fused_add_rms_norm_router` is `fused_add_rms_norm` and that float32 matmul of its output; `fused_moe_routed` is
`fused_moe` of `moe_route`'s routing of given logits.

`fused_moe` computes sum_j weight[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)) with e = ids[t, j], the experts'
weights stacked: gate and up as w13 [E, 2I, H] (gate rows first), down as w2 [E, H, I]. `fused_moe` here is the
reference: every routed (token, expert) pair as its own row, the rows of each expert gathered and multiplied with
that expert's weights in one matmul, then scattered back weighted (on the CPU this reads each routed expert once, at the
memory bound: benchmarks/reports/moe_cpu.md). `fused_moe_gathered` is the graph-safe path for few tokens on CUDA: each
pair's expert weights gathered and applied in one batched matmul, no host sync and no loop.

`fused_moe_int4` and `fused_moe_w8` are the same sum over experts kept quantized (a GGUF's 4-bit or Q8_0 experts, an
FP8 checkpoint's): the reference dequantizes each routed expert's weights to float32 when it is used.
- 4-bit: w13 [E, 2I, H/2] and w2 [E, H, I/2] uint8, column 2j in the low nibble of byte j and 2j + 1 in the high one;
  scales [2, E, N, K/group] float32, the (scale, offset) of each row's groups: w = q * scale + offset, q in 0..15.
- 8-bit: w13 [E, 2I, H] and w2 [E, H, I] int8 or float8_e4m3fn, scales [E, ceil(N/bn), ceil(K/bk)] float32 for
  block_size (bn, bk): w = q * scale of its block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from layerzero.kernels.reference.norm import fused_add_rms_norm
from layerzero.kernels.reference.quantize import dequantize_w8, unpack_int4

SCORINGS = ("softmax", "sigmoid")
ACTIVATIONS = ("silu", "gelu_tanh")


def moe_route(logits: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E]."""
    scores = logits.float().softmax(dim=-1) if scoring == "softmax" else logits.float().sigmoid()
    weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def moe_gate(x: torch.Tensor, router: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`moe_route` of the router's logits x [T, H] @ router [E, H]^T, computed in float32."""
    return moe_route(x.float() @ router.float().t(), top_k, renormalize=renormalize, scoring=scoring)


def fused_add_rms_norm_router(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, router: torch.Tensor,
                              proj: torch.Tensor | None = None, *, eps: float, weight_offset: float
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(normed, x + residual, normed @ router^T in float32); with `proj`, x @ proj^T (in x's dtype) is the x added."""
    if proj is not None:
        x = F.linear(x, proj)
    normed, summed = fused_add_rms_norm(x, residual, weight, eps, weight_offset)
    return normed, summed, normed.float() @ router.float().t()


def fused_moe_routed(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, top_k: int, *,
                     renormalize: bool, scoring: str = "softmax", activation: str = "silu") -> torch.Tensor:
    """`fused_moe` of the experts `moe_route` picks from the logits."""
    weights, ids = moe_route(logits, top_k, renormalize=renormalize, scoring=scoring)
    return fused_moe(x, w13, w2, weights, ids, activation=activation)


def _act(gate: torch.Tensor, activation: str) -> torch.Tensor:
    return F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")


def _expert_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(_act(gate, activation) * up, w2)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              activation: str = "silu") -> torch.Tensor:
    """x [T, H] through each token's routed experts, summed with their weights; [T, H] in x's dtype. Reads the
    routing on the host (one sync) and loops over the experts that received tokens."""
    return _each_expert(x, w13.shape[0], lambda e: (w13[e], w2[e]), weights, ids, activation)


def _each_expert(x: torch.Tensor, experts: int, expert: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                 weights: torch.Tensor, ids: torch.Tensor, activation: str) -> torch.Tensor:
    """The sum over routed experts, `expert(e)` giving expert e's (w13, w2) when it has tokens."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, in token order within one
    counts = torch.bincount(flat, minlength=experts).tolist()
    rows = order // k
    out = torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            pairs = order[start : start + count]
            w13, w2 = expert(e)
            xs = x[rows[start : start + count]]
            y = _expert_mlp(xs if w13.dtype == x.dtype else xs.float(), w13, w2, activation)
            out.index_add_(0, rows[start : start + count], y.float() * weights.reshape(-1)[pairs, None].float())
            start += count
    return out.to(x.dtype)


def dequantize_int4_rows(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 weight [N, K] of 4-bit rows q [N, K/2] with (scale, offset) [2, N, K/group]."""
    scale, offset = (s.float().repeat_interleave(group_size, dim=1) for s in scales)
    return unpack_int4(q).float() * scale + offset


def fused_moe_int4(x: torch.Tensor, w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor,
                   w2_scales: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *, group_size: int,
                   activation: str = "silu") -> torch.Tensor:
    """fused_moe over 4-bit experts, each routed expert dequantized to float32 when used; [T, H] in x's dtype."""
    def expert(e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (dequantize_int4_rows(w13[e], w13_scales[:, e], group_size),
                dequantize_int4_rows(w2[e], w2_scales[:, e], group_size))
    return _each_expert(x, w13.shape[0], expert, weights, ids, activation)


def fused_moe_w8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 weights: torch.Tensor, ids: torch.Tensor, *, block_size: tuple[int, int],
                 activation: str = "silu") -> torch.Tensor:
    """fused_moe over 8-bit experts, each routed expert dequantized to float32 when used; [T, H] in x's dtype."""
    def expert(e: int) -> tuple[torch.Tensor, torch.Tensor]:
        return dequantize_w8(w13[e], w13_scale[e], block_size), dequantize_w8(w2[e], w2_scale[e], block_size)
    return _each_expert(x, w13.shape[0], expert, weights, ids, activation)


def fused_moe_gathered(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                       ids: torch.Tensor, *, activation: str = "silu") -> torch.Tensor:
    """The same sum with every (token, expert) pair's weights gathered ([T * k, 2I, H] and [T * k, H, I]) and applied
    in two batched matmuls: no host sync, no Python loop, so a CUDA graph can hold it; for few tokens (decode) only,
    since the gathered copies double the bytes the routed experts' weights cost."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    xs = x.repeat_interleave(k, dim=0)[:, None, :]  # [T * k, 1, H]
    gate, up = torch.bmm(xs, w13[flat].transpose(1, 2)).chunk(2, dim=-1)
    y = torch.bmm(_act(gate, activation) * up, w2[flat].transpose(1, 2))[:, 0]  # [T * k, H]
    return (y.float().view(tokens, k, -1) * weights.float()[..., None]).sum(dim=1).to(x.dtype)
