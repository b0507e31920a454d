"""Gemma 3: sandwich norms with (1 + w) weights, QK-norm, GeGLU, sliding-window layers with a local rope,
query_pre_attn_scalar attention scale and sqrt(hidden) embedding scaling."""

from __future__ import annotations

import torch

from infer.models.base import Block, CausalLM
from infer.families.config import ModelConfig
from infer.models.forward_batch import ForwardBatch
from infer.models.layers import Attention, GatedMLP, HookPoint, RMSNorm, WeightMap, WeightSlot, prefixed

NORM_OFFSET = 1.0  # Gemma norms scale by (1 + weight)


class Gemma3Block(Block):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.rope_kind = "local" if cfg.is_sliding(layer) else "global"
        self.input_norm = RMSNorm(cfg.hidden_size, eps, NORM_OFFSET)
        self.attn = Attention(cfg, layer, qk_norm=True, norm_offset=NORM_OFFSET)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, eps, NORM_OFFSET)
        self.mlp_norm = RMSNorm(cfg.hidden_size, eps, NORM_OFFSET)
        self.mlp = GatedMLP(cfg)
        self.post_mlp_norm = RMSNorm(cfg.hidden_size, eps, NORM_OFFSET)
        self.resid_post = HookPoint()

    def weight_map(self) -> WeightMap:
        return {
            "input_layernorm.weight": WeightSlot("input_norm.weight"),
            "post_attention_layernorm.weight": WeightSlot("post_attn_norm.weight"),
            "pre_feedforward_layernorm.weight": WeightSlot("mlp_norm.weight"),
            "post_feedforward_layernorm.weight": WeightSlot("post_mlp_norm.weight"),
            **prefixed(self.attn.weight_map(), "self_attn.", "attn."),
            **prefixed(self.mlp.weight_map(), "mlp.", "mlp."),
        }

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, x = self.enter(x, pending)
        h, x = self.mlp_norm.add_and_norm(self.post_attn_norm(self.attn(h, cos, sin, batch)), x)
        return self.leave(x, self.post_mlp_norm(self.mlp(h)))


class Gemma3ForCausalLM(CausalLM):
    block_cls = Gemma3Block
    norm_offset = NORM_OFFSET

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed_tokens(input_ids)
        return x * torch.tensor(self.config.hidden_size**0.5, dtype=x.dtype)
