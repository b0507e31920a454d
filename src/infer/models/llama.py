"""Llama 3 (and SmolLM2): pre-norm blocks, SwiGLU MLP, rope with Llama 3 frequency scaling."""

from __future__ import annotations

import torch

from infer.models.base import Block, CausalLM
from infer.families.config import ModelConfig
from infer.models.forward_batch import ForwardBatch
from infer.models.layers import Attention, GatedMLP, HookPoint, RMSNorm, WeightMap, WeightSlot, prefixed


class LlamaBlock(Block):
    qk_norm = False

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer, qk_norm=self.qk_norm)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg)
        self.resid_post = HookPoint()

    def weight_map(self) -> WeightMap:
        return {
            "input_layernorm.weight": WeightSlot("input_norm.weight"),
            "post_attention_layernorm.weight": WeightSlot("mlp_norm.weight"),
            **prefixed(self.attn.weight_map(), "self_attn.", "attn."),
            **prefixed(self.mlp.weight_map(), "mlp.", "mlp."),
        }

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, x = self.enter(x, pending)
        h, x = self.mlp_norm.add_and_norm(self.attn(h, cos, sin, batch), x)
        return self.leave(x, self.mlp(h))


class LlamaForCausalLM(CausalLM):
    block_cls = LlamaBlock
