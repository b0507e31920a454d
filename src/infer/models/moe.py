"""A mixture of experts' sparse MLP: a router picks each token's k experts, whose gated MLPs run on it and are summed
with the router's weights (layerzero's moe_route and fused_moe). The experts' weights are stacked, one tensor per
projection: gate and up as w13 [E, 2I, H] (gate rows first), down as w2 [E, H, I]; the checkpoint's per-expert
tensors are copied into their slices at load, so no second copy of the experts ever exists."""

from __future__ import annotations

import torch
from torch import nn

import layerzero as lz
from infer.families.catalog import MoE
from infer.families.config import ModelConfig
from infer.models.layers import WeightMap, WeightSlot, empty_param
from infer.models.quant import LinearSite

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # the config's name -> fused_moe's


class SparseMLP(nn.Module):
    """The router and the stacked experts of one sparse layer. Under tensor parallelism every rank holds all experts'
    slices of the intermediate dimension (w13's rows, w2's columns), and the output is summed over ranks."""

    def __init__(self, cfg: ModelConfig, moe: MoE) -> None:
        super().__init__()
        experts, inner, hidden = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.projections, self.inner = moe.projections, inner  # the checkpoint's gate, up, down names
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.activation = ACTIVATIONS[cfg.hidden_act]
        self.router = empty_param(experts, hidden)
        self.w13 = empty_param(experts, 2 * inner, hidden)
        self.w2 = empty_param(experts, hidden, inner)
        self.router_site = LinearSite()
        self.route_site, self.experts_site = lz.bind("moe_route"), lz.bind("fused_moe")
        self.tp_group: object | None = None  # tensor parallel: w2 holds this rank's columns, summed over ranks
        self.reduce_site = lz.bind("all_reduce")

    def weight_map(self) -> WeightMap:
        """The checkpoint's names under the layer's MLP prefix -> the router and each expert's slices."""
        gate, up, down = self.projections
        out = {"gate.weight": WeightSlot("router")}
        for e in range(self.router.shape[0]):
            out |= {f"experts.{e}.{gate}.weight": WeightSlot("w13", 0, self.inner, index=e),
                    f"experts.{e}.{up}.weight": WeightSlot("w13", self.inner, self.inner, index=e),
                    f"experts.{e}.{down}.weight": WeightSlot("w2", index=e)}
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router_site(x, self.router)
        weights, ids = self.route_site(logits, self.top_k, renormalize=self.renormalize)
        out = self.experts_site(x, self.w13, self.w2, weights, ids, activation=self.activation)
        return out if self.tp_group is None else self.reduce_site(out, group=self.tp_group)
