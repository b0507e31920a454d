"""Mixture of experts: routing and the experts' gated MLPs, as plain compositions of torch ops.

`moe_route` turns router logits [T, E] into each token's top-k experts and their weights: scores are the softmax (or
sigmoid) of the logits in float32, the k highest are taken (ties in torch.topk's own order), and
with `renormalize` their weights are divided by their sum (Mixtral always; Qwen 3 MoE when `norm_topk_prob`).

`fused_moe` computes sum_j weight[t, j] * down_e(act(gate_e(x_t)) * up_e(x_t)) with e = ids[t, j], the experts'
weights stacked: gate and up as w13 [E, 2I, H] (gate rows first), down as w2 [E, H, I]. `fused_moe` here is the
reference: every routed (token, expert) pair as its own row, the rows of each expert gathered and multiplied with
that expert's weights in one matmul, then scattered back weighted (on the CPU this reads each routed expert once, at the
memory bound: benchmarks/reports/moe_cpu.md). `fused_moe_gathered` is the graph-safe path for few tokens on CUDA: each
pair's expert weights gathered and applied in one batched matmul, no host sync and no loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


def _act(gate: torch.Tensor, activation: str) -> torch.Tensor:
    return F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")


def _expert_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, activation: str) -> torch.Tensor:
    gate, up = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(_act(gate, activation) * up, w2)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              activation: str = "silu") -> torch.Tensor:
    """x [T, H] through each token's routed experts, summed with their weights; [T, H] in x's dtype. Reads the
    routing on the host (one sync) and loops over the experts that received tokens."""
    tokens, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, in token order within one
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    rows = order // k
    out = torch.zeros(tokens, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            pairs = order[start : start + count]
            y = _expert_mlp(x[rows[start : start + count]], w13[expert], w2[expert], activation)
            out.index_add_(0, rows[start : start + count], y.float() * weights.reshape(-1)[pairs, None].float())
            start += count
    return out.to(x.dtype)


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
